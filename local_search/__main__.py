"""``python -m local_search build|serve``."""

from local_search.cli import run

if __name__ == "__main__":
    run()

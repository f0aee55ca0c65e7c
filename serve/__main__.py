"""``python -m serve``."""

from serve.cli import run

if __name__ == "__main__":
    run()

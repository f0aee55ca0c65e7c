"""Applications built on top of everything else: the ``mia demo`` story, the gold research
transcripts of a world (``mia gold``, which replays each one against a live local_search) and the
warm-started embedded roles (gold -> SFT -> cached model folder).

They sit above the role and service packages (they start services and run TTRL), so nothing
below imports them: import-linter's layers contract in pyproject.toml says so.
"""

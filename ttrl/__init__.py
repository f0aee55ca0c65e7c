"""Test-time RL over a test stream (``python -m ttrl mode=supervised|nogt``). Filled by the trainers issue."""

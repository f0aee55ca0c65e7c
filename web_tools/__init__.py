"""Online search gateway (``python -m web_tools serve``): Serper-backed /search with a SQLite cache."""

"""MIA core: shared machinery (LLM clients, agent loop, RL engine, judges, data, models, HTTP pieces)."""

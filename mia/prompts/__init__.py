"""Prompt templates shared by training and serving (one module per role)."""

"""One async chat interface (``mia.llm.base``) with OpenAI-compatible HTTP, in-process transformers and scripted backends."""

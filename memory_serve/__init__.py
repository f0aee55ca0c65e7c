"""The Memory Manager service (``python -m memory_serve``): store, embed, retrieve, compress, plan."""

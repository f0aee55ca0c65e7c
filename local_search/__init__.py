"""Offline retrieval (``python -m local_search build|serve``): BM25 (bm25s) or dense (FAISS) behind the Search-R1 /retrieve protocol."""

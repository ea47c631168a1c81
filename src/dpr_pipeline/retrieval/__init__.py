"""Retrieval: BM25 (Pyserini), encoding the corpus and queries, faiss indexes, dense search and mining negatives."""

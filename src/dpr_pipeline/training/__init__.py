"""Training: the generic loop (``trainer``), multi-process helpers (``distributed``) and the stage trainers."""

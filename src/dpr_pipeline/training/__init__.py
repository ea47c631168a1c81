"""Fine-tuning: the generic loop (``trainer``), multi-process training (``distributed``, ``launch``), the losses, the
bi-encoder and cross-encoder trainers, and the bi-encoder's dev selection."""

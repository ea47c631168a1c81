"""Evaluation: metrics, paired differences, seed spreads, the per-dataset and transfer summaries."""

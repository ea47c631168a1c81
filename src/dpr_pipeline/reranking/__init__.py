"""Re-ranking with the cross-encoder: scoring pairs, re-ranking runs, fusing scores, teacher scores."""

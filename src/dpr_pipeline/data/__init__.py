"""Dataset readers (BEIR, MS MARCO, Parquet), the artifact schemas and their checks."""

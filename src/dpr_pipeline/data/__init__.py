"""The data: downloading and reading raw datasets (BEIR, MS MARCO, DPR, Parquet), ingestion into the artifact
schemas, dev splits, the shared passage store, corpus shards, answers and TREC runs."""

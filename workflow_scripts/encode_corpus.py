import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.retrieval.encode import encode_corpus_shard
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    p = snakemake.params.encoding
    encode_corpus_shard(snakemake.input.model, snakemake.input.corpus, snakemake.output.vectors,
                        snakemake.output.ids, shard=int(snakemake.wildcards.shard), num_shards=p["encode_shards"],
                        max_length=p["passage_max_length"], batch_size=p["encode_batch_size"],
                        dtype=p["embedding_dtype"], bf16=p["bf16"])

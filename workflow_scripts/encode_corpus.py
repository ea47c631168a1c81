import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.retrieval.encode import encode_corpus_shard
from dpr_pipeline.workflow.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    r = snakemake.params.retriever
    # a transfer job encodes target B's passages at B's length (None: the model's own max_seq_length)
    transfer = r.get("transfer_max_length")
    encode_corpus_shard(snakemake.input.model, snakemake.input.corpus, snakemake.output.vectors,
                        snakemake.output.ids, shard=int(snakemake.wildcards.shard), num_shards=r["encode_shards"],
                        max_length=transfer["passage"] if transfer else snakemake.params.stage["passage_max_length"],
                        batch_size=r["encode_batch_size"], dtype=r["embedding_dtype"],
                        bf16=snakemake.params.stage["bf16"])

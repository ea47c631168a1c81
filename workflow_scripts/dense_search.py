import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.retrieval.dense_search import dense_search
from dpr_pipeline.workflow.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    r = snakemake.params.retriever
    index = r["index"]
    # a transfer job encodes target B's queries at B's length (None: the model's own max_seq_length)
    transfer = r.get("transfer_max_length")
    dense_search(snakemake.input.model, snakemake.input.index, snakemake.input.ids, snakemake.input.queries,
                 snakemake.output[0], depth=snakemake.params.depth,
                 query_max_length=transfer["query"] if transfer else snakemake.params.stage["query_max_length"],
                 batch_size=r["encode_batch_size"],
                 tag=f"dpr_pipeline-{snakemake.wildcards.stage}",
                 hnsw_ef_search=index["hnsw_ef_search"] if index["kind"] == "hnsw" else None,
                 ivf_nprobe=index["ivf_nprobe"] if index["kind"] == "ivfpq" else None,
                 bf16=snakemake.params.stage["bf16"])

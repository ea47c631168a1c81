import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.retrieval.dense_search import dense_search
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    p = snakemake.params.search
    index = p["index"]
    dense_search(snakemake.input.model, snakemake.input.index, snakemake.input.ids, snakemake.input.queries,
                 snakemake.output[0], depth=snakemake.params.depth,
                 query_max_length=p["query_max_length"], batch_size=p["encode_batch_size"],
                 tag=f"dpr_pipeline-{snakemake.wildcards.stage}",
                 hnsw_ef_search=index["hnsw_ef_search"] if index["kind"] == "hnsw" else None,
                 ivf_nprobe=index["ivf_nprobe"] if index["kind"] == "ivfpq" else None,
                 bf16=p["bf16"], search_device=index["search_device"])

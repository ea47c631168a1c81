import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.retrieval.dense_search import dense_search
from dpr_pipeline.retrieval.settings import DenseSearchSettings
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    settings = DenseSearchSettings.from_params(snakemake.params.search)
    dense_search(snakemake.input.model, snakemake.input.index, snakemake.input.ids, snakemake.input.queries,
                 snakemake.output[0], depth=snakemake.params.depth,
                 query_max_length=settings.query_max_length, batch_size=settings.encode_batch_size,
                 tag=snakemake.params.get("tag") or f"dpr_pipeline-{snakemake.wildcards.stage}",
                 hnsw_ef_search=settings.hnsw_ef_search, ivf_nprobe=settings.ivf_nprobe, bf16=settings.bf16,
                 search_device=settings.index["search_device"])

import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.data.ingest import ingest_official_negatives
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    ingest_official_negatives(snakemake.input.negatives, snakemake.input.qrels, snakemake.output[0],
                              min_relevance=snakemake.params.min_relevance)

import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.retrieval.negatives import write_bm25_negatives
from dpr_pipeline.retrieval.settings import MiningSettings
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    settings = MiningSettings.from_params(snakemake.params.mining)
    write_bm25_negatives(snakemake.input.pool, snakemake.input.qrels, snakemake.output[0],
                         depth=settings.depth, keep=settings.keep, seed=settings.seed,
                         min_relevance=snakemake.params.min_relevance,
                         answers=snakemake.input.get("answers"), corpus=snakemake.input.corpus,
                         filters=settings.filters("mining.bm25"), queries=snakemake.input.queries,
                         filter_report=snakemake.output.filter_report, dropped_sample=snakemake.output.dropped_sample,
                         denoise_scores=snakemake.input.get("denoise_scores"))

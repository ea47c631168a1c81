import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.retrieval.negative_filters import NegativeFilters
from dpr_pipeline.retrieval.negatives import write_bm25_negatives
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    p = snakemake.params.mining
    write_bm25_negatives(snakemake.input.pool, snakemake.input.qrels, snakemake.output[0],
                         depth=p["depth"], keep=p["keep"], seed=p["seed"],
                         min_relevance=snakemake.params.min_relevance,
                         answers=snakemake.input.get("answers"), corpus=snakemake.input.corpus,
                         filters=NegativeFilters.from_settings(p, "mining.bm25"), queries=snakemake.input.queries,
                         filter_report=snakemake.output.filter_report, dropped_sample=snakemake.output.dropped_sample,
                         denoise_scores=snakemake.input.get("denoise_scores"))

import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.retrieval.negatives import mine_hard_negatives
from dpr_pipeline.retrieval.settings import MiningSettings
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    stage = snakemake.wildcards.stage
    settings = MiningSettings.from_params(snakemake.params.mining)
    mine_hard_negatives(snakemake.input.run, snakemake.input.qrels, snakemake.output[0],
                        depth=settings.depth, keep=settings.keep, seed=settings.seed,
                        min_relevance=snakemake.params.min_relevance, source=stage,
                        answers=snakemake.input.get("answers"), corpus=snakemake.input.corpus,
                        filters=settings.filters(f"mining.{stage}"),
                        queries=snakemake.input.queries, filter_report=snakemake.output.filter_report,
                        dropped_sample=snakemake.output.dropped_sample,
                        denoise_scores=snakemake.input.get("denoise_scores"))

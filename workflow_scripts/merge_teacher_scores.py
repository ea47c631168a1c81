import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.reranking.teacher_scores import merge_score_shards
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    merge_score_shards(snakemake.input, snakemake.output[0])

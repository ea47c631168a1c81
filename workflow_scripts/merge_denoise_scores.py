from dpr_pipeline.reranking.pool_scores import DENOISE_SOURCE
from dpr_pipeline.reranking.teacher_scores import merge_score_shards
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    merge_score_shards(snakemake.input, snakemake.output[0], source=DENOISE_SOURCE)

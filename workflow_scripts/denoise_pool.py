from dpr_pipeline.retrieval.negatives import write_denoise_pool
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    write_denoise_pool(snakemake.input.pool, snakemake.input.qrels, snakemake.output[0],
                       depth=snakemake.params.pool["depth"], min_relevance=snakemake.params.min_relevance,
                       answers=snakemake.input.get("answers"), corpus=snakemake.input.get("corpus"))

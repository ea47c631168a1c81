import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.orchestration.job_log import logged
from dpr_pipeline.orchestration.training_job import job_settings, run_training_job

with logged(snakemake.log[0], snakemake.threads):
    run_training_job(snakemake, "reranker", job_settings("reranker", snakemake.params.reranker), in_batch=False)

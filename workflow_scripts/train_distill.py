import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.orchestration.job_log import logged
from dpr_pipeline.orchestration.training_job import dev_selection, job_settings, run_training_job

with logged(snakemake.log[0], snakemake.threads):
    run_training_job(snakemake, "distill", job_settings("distill", snakemake.params.distill), in_batch=True,
                     selection=dev_selection(snakemake))

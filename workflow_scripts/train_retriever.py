import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.training.biencoder import train_biencoder
from dpr_pipeline.orchestration.job_log import logged
from dpr_pipeline.orchestration.training_job import job_settings, run_training_job, dev_selection

with logged(snakemake.log[0], snakemake.threads):
    stage = snakemake.wildcards.stage
    run_training_job(snakemake, train_biencoder, stage, job_settings(stage, snakemake.params.retriever),
                     in_batch=True, selection=dev_selection(snakemake))

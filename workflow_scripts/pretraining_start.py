import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.models.reinitialize import write_reinitialized_start
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    start = snakemake.params.start
    write_reinitialized_start(start["plm"], start["layers"], start["seed"], snakemake.output.model,
                              start["max_length"])

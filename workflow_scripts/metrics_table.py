import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.stages import STAGE_LABELS
from dpr_pipeline.report.tables import write_metrics_table
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    stage = snakemake.wildcards.stage
    write_metrics_table(snakemake.input[0], snakemake.output[0],
                        f"{snakemake.wildcards.dataset}: {STAGE_LABELS.get(stage, stage)} metrics")

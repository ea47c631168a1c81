import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.report.plots import plot_training_loss
from dpr_pipeline.stages import training_loss
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    plot_training_loss(snakemake.input[0], snakemake.output[0],
                       f"{snakemake.wildcards.dataset}: {training_loss(snakemake.wildcards.trained)}")

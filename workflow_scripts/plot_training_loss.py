import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.plots import plot_training_loss
from dpr_pipeline.stages import training_loss
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0]):
    plot_training_loss(snakemake.input[0], snakemake.output[0],
                       f"{snakemake.wildcards.dataset}: {training_loss(snakemake.wildcards.trained)}")

import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.plots import plot_training_loss, training_loss_title
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0]):
    plot_training_loss(snakemake.input[0], snakemake.output[0],
                       f"{snakemake.wildcards.dataset}: {training_loss_title(snakemake.wildcards.trained)}")

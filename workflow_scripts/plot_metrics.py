import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.plots import plot_stage_metrics
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0]):
    plot_stage_metrics(snakemake.input[0], snakemake.output[0],
                       f"{snakemake.wildcards.dataset}: {snakemake.wildcards.stage}")

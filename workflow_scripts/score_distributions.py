import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.report.plots import plot_score_distributions, score_panels
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    mined = {name: path for name, path in snakemake.input.items() if name != "teacher"}
    panels = score_panels(mined, snakemake.input.teacher)  # panel title: (negatives file, what its scores are)
    plot_score_distributions({name: path for name, (path, _) in panels.items()}, snakemake.output[0],
                             f"{snakemake.wildcards.dataset}: scores of train positives vs hard negatives",
                             score_names={name: label for name, (_, label) in panels.items()})

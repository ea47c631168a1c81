import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.report.throughput import write_throughput
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    write_throughput(snakemake.params.jobs, snakemake.output.tsv, snakemake.output.html, snakemake.output.png,
                     f"{snakemake.wildcards.dataset}: throughput per job")

import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.throughput import write_throughput
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0]):
    write_throughput(snakemake.params.jobs, snakemake.output.tsv, snakemake.output.html, snakemake.output.png,
                     f"{snakemake.wildcards.dataset}: throughput per job")

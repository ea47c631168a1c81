import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.summary import write_summary
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0]):
    write_summary(dict(zip(snakemake.params.stages, snakemake.input)), snakemake.output.json,
                  snakemake.output.markdown, snakemake.output.png)

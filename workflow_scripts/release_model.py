import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.model_card import write_release
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0], snakemake.threads):
    write_release(snakemake.input.model, snakemake.input.manifest, snakemake.input.metrics, snakemake.output[0])

import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.bm25 import build_index
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0]):
    build_index(snakemake.input[0], snakemake.output[0], fields=snakemake.params.bm25["fields"],
                threads=snakemake.threads)

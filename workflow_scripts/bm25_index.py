import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.bm25 import build_index
from dpr_pipeline.workflow import logged, write_job_manifest

with logged(snakemake.log[0]):
    build_index(snakemake.input.corpus, snakemake.output.index, fields=snakemake.params.bm25["fields"],
                threads=snakemake.threads)
    write_job_manifest(snakemake, "bm25", seed=None)

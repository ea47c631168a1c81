import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.data.ingest import ingest_answers
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0]):
    ingest_answers(snakemake.params.root, snakemake.wildcards.split, snakemake.output[0], files=snakemake.params.files)

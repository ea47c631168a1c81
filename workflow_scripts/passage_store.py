import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.data.passage_store import write_passage_store
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0], snakemake.threads):
    write_passage_store(snakemake.input[0], snakemake.output[0])

import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.data.ingest import ingest_corpus
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0]):
    ingest_corpus(snakemake.params.format, snakemake.params.root, snakemake.output[0],
                  skip_empty_documents=snakemake.params.skip_empty_documents)

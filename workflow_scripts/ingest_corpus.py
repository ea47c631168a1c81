import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.data.ingest import ingest_corpus
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    ingest_corpus(snakemake.params.format, snakemake.params.root, snakemake.output[0],
                  skip_empty_documents=snakemake.params.skip_empty_documents)

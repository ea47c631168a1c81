import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.data.ingest import ingest_answers
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    ingest_answers(snakemake.params.root, snakemake.wildcards.split, snakemake.output[0], files=snakemake.params.files)

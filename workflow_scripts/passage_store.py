import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.data.passage_store import write_passage_store
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    write_passage_store(snakemake.input[0], snakemake.output[0])

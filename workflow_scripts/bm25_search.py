import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.retrieval.bm25 import search
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    p = snakemake.params.bm25
    search(snakemake.input.index, snakemake.input.queries, snakemake.output[0], depth=snakemake.params.depth,
           k1=p["k1"], b=p["b"], fields=p["fields"], threads=snakemake.threads,
           ignore_identical_ids=snakemake.params.ignore_identical_ids, java_heap=p["java_heap"])

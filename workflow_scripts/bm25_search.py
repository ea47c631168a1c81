import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.retrieval.bm25 import search
from dpr_pipeline.retrieval.settings import BM25Settings
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    settings = BM25Settings.from_params(snakemake.params.bm25)
    search(snakemake.input.index, snakemake.input.queries, snakemake.output[0], depth=snakemake.params.depth,
           k1=settings.k1, b=settings.b, fields=settings.fields, threads=snakemake.threads,
           ignore_identical_ids=snakemake.params.ignore_identical_ids, java_heap=settings.java_heap)

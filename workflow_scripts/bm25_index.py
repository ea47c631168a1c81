import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.retrieval.bm25 import build_index
from dpr_pipeline.retrieval.settings import BM25Settings
from dpr_pipeline.orchestration.job_log import logged
from dpr_pipeline.orchestration.manifests import write_job_manifest

with logged(snakemake.log[0]):
    settings = BM25Settings.from_params(snakemake.params.bm25)
    build_index(snakemake.input.corpus, snakemake.output.index, fields=settings.fields, threads=snakemake.threads)
    write_job_manifest(snakemake, "bm25", seed=None)

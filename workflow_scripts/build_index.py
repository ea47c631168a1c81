import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.retrieval.dense_index import build_index
from dpr_pipeline.retrieval.settings import DenseIndexSettings
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    index = DenseIndexSettings.from_params(snakemake.params.index).index
    build_index(snakemake.input.vectors, snakemake.input.ids, snakemake.output.index, snakemake.output.ids,
                kind=index["kind"], hnsw_m=index["hnsw_m"], ivf_lists=index["ivf_lists"],
                pq_subquantizers=index["pq_subquantizers"])

import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.dense_index import build_index
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0], snakemake.threads):
    index = snakemake.params.retriever["index"]
    build_index(snakemake.input.vectors, snakemake.input.ids, snakemake.output.index, snakemake.output.ids,
                kind=index["kind"], hnsw_m=index["hnsw_m"], ivf_lists=index["ivf_lists"],
                pq_subquantizers=index["pq_subquantizers"])

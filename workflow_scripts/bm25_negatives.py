import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.negatives import write_bm25_negatives
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0]):
    p = snakemake.params.bm25
    write_bm25_negatives(snakemake.input.pool, snakemake.input.qrels, snakemake.output[0],
                         depth=p["negatives_depth"], count=p["negatives_per_query"], seed=p["seed"],
                         min_relevance=snakemake.params.min_relevance,
                         answers=snakemake.input.get("answers"), corpus=snakemake.input.get("corpus"))

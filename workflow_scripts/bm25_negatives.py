import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.negatives import write_bm25_negatives
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0]):
    p = snakemake.params.mining
    write_bm25_negatives(snakemake.input.pool, snakemake.input.qrels, snakemake.output[0],
                         depth=p["depth"], keep=p["keep"], seed=p["seed"],
                         min_relevance=snakemake.params.min_relevance,
                         answers=snakemake.input.get("answers"), corpus=snakemake.input.get("corpus"))

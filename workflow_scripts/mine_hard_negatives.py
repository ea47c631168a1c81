import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.negatives import mine_hard_negatives
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0]):
    p = snakemake.params.mining
    mine_hard_negatives(snakemake.input.run, snakemake.input.qrels, snakemake.output[0],
                        depth=p["depth"], keep=p["keep"], seed=p["seed"],
                        min_relevance=snakemake.params.min_relevance, source=snakemake.wildcards.stage,
                        answers=snakemake.input.get("answers"), corpus=snakemake.input.get("corpus"))

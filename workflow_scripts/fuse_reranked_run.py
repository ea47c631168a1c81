import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.reranking.score_fusion import mixing_weight, write_fused_run
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]) as log:
    fusion = snakemake.params.fusion
    weight = mixing_weight(fusion["weight"])
    log.info("re-ranker weight %s over the top %d hits", weight, fusion["depth"])
    write_fused_run(snakemake.input.reranker, snakemake.input.first_stage, snakemake.output[0], weight=weight,
                    depth=fusion["depth"], tag="dpr_pipeline-reranker")

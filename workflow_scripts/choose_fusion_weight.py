import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.reranking.score_fusion import write_fusion_choice
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]) as log:
    fusion = snakemake.params.fusion
    choice = write_fusion_choice(snakemake.input.reranker, snakemake.input.first_stage, snakemake.input.qrels,
                                 snakemake.output[0], depth=fusion["depth"], metric=fusion["metric"],
                                 relevance_level=fusion["relevance_level"], split=fusion["split"])
    log.info("fusion weight %s (best %s, %s from the equal mix; %s on %s: %s)", choice["weight"], choice["best"],
             "resolved" if choice["resolved"] else "not resolved", choice["metric"], fusion["split"], choice["values"])

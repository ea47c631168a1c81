import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.evaluation.metrics import evaluate_answer_splits, evaluate_splits
from dpr_pipeline.training.tracking import evaluation_scalars, log_once
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]) as log:
    if snakemake.params.relevance == "answers":
        result = evaluate_answer_splits(list(snakemake.input.runs), list(snakemake.input.answers),
                                        snakemake.input.corpus, list(snakemake.params.splits),
                                        list(snakemake.params.metrics), snakemake.output[0],
                                        manifest=snakemake.input.manifest)
    else:
        result = evaluate_splits(list(snakemake.input.runs), list(snakemake.input.qrels),
                                 list(snakemake.params.splits), list(snakemake.params.metrics), snakemake.output[0],
                                 relevance_levels=dict(snakemake.params.relevance_levels),
                                 ignore_identical_ids=snakemake.params.ignore_identical_ids,
                                 manifest=snakemake.input.manifest)
    log.info("%s", result)
    # the stage's tracked run (off by default); a transfer evaluation's metrics under transfer/<target>/
    log_once(snakemake.params.tracking, evaluation_scalars(result, getattr(snakemake.wildcards, "target", None)))

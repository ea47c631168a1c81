import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.evaluation.transfer_summary import check_transfer_leakage
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    check_transfer_leakage(getattr(snakemake.input, "train_queries", None),
                           dict(zip(snakemake.params.splits, snakemake.input.target_queries)), snakemake.output[0],
                           snakemake.params.allow_overlap)

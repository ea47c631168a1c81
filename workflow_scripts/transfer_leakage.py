import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.transfer import check_transfer_leakage
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0]):
    check_transfer_leakage(getattr(snakemake.input, "train_queries", None),
                           dict(zip(snakemake.params.splits, snakemake.input.target_queries)), snakemake.output[0],
                           snakemake.params.allow_overlap)

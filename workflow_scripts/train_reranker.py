import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.reranker import train_reranker
from dpr_pipeline.workflow import logged, run_training_job

with logged(snakemake.log[0], snakemake.threads):
    run_training_job(snakemake, train_reranker, "reranker", snakemake.params.reranker, in_batch=False)

import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.training.biencoder import train_biencoder
from dpr_pipeline.workflow import logged, run_training_job, selection_options

with logged(snakemake.log[0], snakemake.threads):
    run_training_job(snakemake, train_biencoder, "distill", snakemake.params.distill, in_batch=True, distill=True,
                     selection=selection_options(snakemake))

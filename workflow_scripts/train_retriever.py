import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.training.biencoder import train_biencoder
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0], snakemake.threads):
    train_biencoder(snakemake.input.negatives, snakemake.input.corpus, snakemake.input.queries,
                    snakemake.output.model, snakemake.params.checkpoints, snakemake.output.loss_log,
                    snakemake.params.retriever)

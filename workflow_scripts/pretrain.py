import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.pretraining.train import pretrain
from dpr_pipeline.cluster import processes_for
from dpr_pipeline.training.launch import run_training
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0], snakemake.threads):
    params = snakemake.params.pretrain
    run_training(pretrain, processes_for(snakemake.resources.gpu), token_shards=list(snakemake.input.tokens),
                 output_dir=snakemake.output.model, checkpoint_dir=snakemake.params.checkpoints,
                 loss_log=snakemake.output.loss_log, params=params,
                 ngram_counts=snakemake.input.ngram_counts[0] if snakemake.input.ngram_counts else None)

import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.reranker import train_reranker
from dpr_pipeline.training.launch import run_training
from dpr_pipeline.cluster import processes_for
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0], snakemake.threads):
    params = snakemake.params.reranker
    run_training(train_reranker, processes_for(snakemake.resources.gpu), negatives_path=snakemake.input.negatives,
                 corpus_path=snakemake.input.corpus, queries_path=snakemake.input.queries,
                 output_dir=snakemake.output.model, checkpoint_dir=snakemake.params.checkpoints,
                 loss_log=snakemake.output.loss_log, params=params)

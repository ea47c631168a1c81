import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.reranker import train_reranker
from dpr_pipeline.training.launch import run_training
from dpr_pipeline.cluster import processes_for
from dpr_pipeline.workflow import group_negatives, logged, write_job_manifest

with logged(snakemake.log[0], snakemake.threads):
    params = snakemake.params.reranker
    processes = processes_for(snakemake.resources.gpu)
    run_training(train_reranker, processes, negatives_path=snakemake.input.negatives,
                 corpus_path=snakemake.input.corpus, queries_path=snakemake.input.queries,
                 output_dir=snakemake.output.model, checkpoint_dir=snakemake.params.checkpoints,
                 loss_log=snakemake.output.loss_log, params=params)
    write_job_manifest(snakemake, "reranker", seed=params["seed"], world_size=processes,
                       negatives=group_negatives(snakemake, params, in_batch=False))

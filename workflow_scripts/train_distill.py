import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.training.biencoder import train_biencoder
from dpr_pipeline.training.launch import run_training
from dpr_pipeline.cluster import processes_for
from dpr_pipeline.workflow import group_negatives, logged, write_job_manifest

with logged(snakemake.log[0], snakemake.threads):
    params = snakemake.params.distill
    processes = processes_for(snakemake.resources.gpu)
    run_training(train_biencoder, processes, negatives_path=snakemake.input.negatives,
                 corpus_path=snakemake.input.corpus, queries_path=snakemake.input.queries,
                 output_dir=snakemake.output.model, checkpoint_dir=snakemake.params.checkpoints,
                 loss_log=snakemake.output.loss_log, params=params, distill=True)
    write_job_manifest(snakemake, "distill", seed=params["seed"], world_size=processes,
                       negatives=group_negatives(snakemake, params, in_batch=True))

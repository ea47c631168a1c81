import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.pretraining.methods import pretraining_method
from dpr_pipeline.orchestration.resources import nodes_of, processes_for
from dpr_pipeline.orchestration.training_job import job_settings
from dpr_pipeline.stages import PRETRAINING, member
from dpr_pipeline.training.launch import run_training
from dpr_pipeline.orchestration.job_log import logged
from dpr_pipeline.orchestration.manifests import write_job_manifest

with logged(snakemake.log[0], snakemake.threads):
    stage = member(PRETRAINING, snakemake.wildcards.method)
    settings = job_settings(stage, snakemake.params.pretrain)
    resources = dict(snakemake.resources.items())
    processes = processes_for(resources)
    run_training(stage, processes, nodes=nodes_of(resources), cpus_per_node=snakemake.threads,
                 token_shards=list(snakemake.input.tokens),
                 output_dir=snakemake.output.model, checkpoint_dir=snakemake.params.checkpoints,
                 loss_log=snakemake.output.loss_log, settings=settings, tracking=snakemake.params.tracking.as_dict(),
                 ngram_counts=snakemake.input.ngram_counts[0] if snakemake.input.ngram_counts else None)
    write_job_manifest(snakemake, stage, seed=settings.training.seed, world_size=processes,
                       negatives=pretraining_method(settings.objective.method).negatives(settings.training.batch_size))

import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.reranking.pool_scores import write_pool_scores
from dpr_pipeline.reranking.settings import DenoiseScoringSettings
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    settings = DenoiseScoringSettings.from_params(snakemake.params.denoise)
    write_pool_scores(settings.model, snakemake.input.pool, snakemake.input.passages, snakemake.input.queries,
                      snakemake.output[0], max_length=settings.max_length, batch_size=settings.batch_size,
                      bf16=settings.bf16, shard=int(snakemake.wildcards.shard), num_shards=settings.shards)

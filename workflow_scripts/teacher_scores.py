import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.reranking.settings import TeacherScoreSettings
from dpr_pipeline.reranking.teacher_scores import score_teacher_shard
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    settings = TeacherScoreSettings.from_params(snakemake.params.reranker)
    score_teacher_shard(snakemake.input.model, snakemake.input.negatives, snakemake.input.passages,
                        snakemake.input.queries, snakemake.output[0], shard=int(snakemake.wildcards.shard),
                        num_shards=settings.teacher_shards, max_length=settings.max_length,
                        batch_size=settings.score_batch_size, bf16=settings.bf16, draws=snakemake.params.draws)

import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.reranking.teacher_scores import score_teacher_shard
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    p = snakemake.params.reranker
    score_teacher_shard(snakemake.input.model, snakemake.input.negatives, snakemake.input.passages,
                        snakemake.input.queries, snakemake.output[0], shard=int(snakemake.wildcards.shard),
                        num_shards=p["teacher_shards"], max_length=p["max_length"], batch_size=p["score_batch_size"],
                        bf16=p["bf16"], draws=snakemake.params.draws)

import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.teacher_scores import score_teacher_shard
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0], snakemake.threads):
    p = snakemake.params.reranker
    score_teacher_shard(snakemake.input.model, snakemake.input.negatives, snakemake.input.passages,
                        snakemake.input.queries, snakemake.output[0], shard=int(snakemake.wildcards.shard),
                        num_shards=p["teacher_shards"], max_length=p["max_length"], batch_size=p["score_batch_size"],
                        bf16=p["bf16"], draws=snakemake.params.draws)

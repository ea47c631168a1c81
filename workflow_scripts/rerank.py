import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.reranking import rerank_run
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0], snakemake.threads):
    p = snakemake.params.reranker
    rerank_run(snakemake.input.model, snakemake.input.run, snakemake.input.passages, snakemake.input.queries,
               snakemake.output[0], depth=p["rerank_depth"], max_length=p["max_length"],
               batch_size=p["score_batch_size"], tag="dpr_pipeline-reranker", bf16=p["bf16"])

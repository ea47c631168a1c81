import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.reranking.rerank import rerank_run
from dpr_pipeline.reranking.settings import RerankSettings
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    settings = RerankSettings.from_params(snakemake.params.reranker)
    rerank_run(snakemake.input.model, snakemake.input.run, snakemake.input.passages, snakemake.input.queries,
               snakemake.output[0], depth=settings.rerank_depth, max_length=settings.max_length,
               batch_size=settings.score_batch_size, tag="dpr_pipeline-reranker", bf16=settings.bf16)

import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.pretraining.settings import TokenizeCorpusSettings
from dpr_pipeline.pretraining.tokens import tokenize_corpus_shard
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    settings = TokenizeCorpusSettings.from_params(snakemake.params.pretrain)
    tokenize_corpus_shard(settings.plm, snakemake.input.corpus, snakemake.output[0],
                          shard=int(snakemake.wildcards.shard), num_shards=settings.tokenize_shards,
                          max_length=settings.max_length)

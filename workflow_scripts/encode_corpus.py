import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.retrieval.encode import encode_corpus_shard
from dpr_pipeline.retrieval.settings import EncodeCorpusSettings
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    settings = EncodeCorpusSettings.from_params(snakemake.params.encoding)
    encode_corpus_shard(snakemake.input.model, snakemake.input.corpus, snakemake.output.vectors,
                        snakemake.output.ids, shard=int(snakemake.wildcards.shard), num_shards=settings.encode_shards,
                        max_length=settings.passage_max_length, batch_size=settings.encode_batch_size,
                        dtype=settings.embedding_dtype, bf16=settings.bf16)

import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.pretraining.settings import NgramCountSettings
from dpr_pipeline.pretraining.token_importance import write_corpus_ngram_counts
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    settings = NgramCountSettings.from_params(snakemake.params.pretrain)
    write_corpus_ngram_counts(list(snakemake.input.tokens), settings.plm, snakemake.output[0],
                              max_n=settings.cdmae_window)

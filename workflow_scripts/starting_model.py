import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.orchestration.card import write_job_card
from dpr_pipeline.models.embedding import save_starting_model
from dpr_pipeline.models.settings import StartingModelSettings
from dpr_pipeline.orchestration.job_log import logged
from dpr_pipeline.orchestration.manifests import write_job_manifest

with logged(snakemake.log[0], snakemake.threads):
    settings = StartingModelSettings.from_params(snakemake.params.start)
    save_starting_model(settings.plm, settings.pooling, snakemake.output.model, settings.passage_max_length,
                        settings.query_max_length, settings.query_prompt, settings.passage_prompt)
    write_job_card(snakemake, "start", seed=None)
    write_job_manifest(snakemake, "start", seed=None)

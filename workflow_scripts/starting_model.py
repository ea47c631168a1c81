import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.orchestration.card import write_job_card
from dpr_pipeline.models.embedding import save_starting_model
from dpr_pipeline.orchestration.job_log import logged
from dpr_pipeline.orchestration.manifests import write_job_manifest

with logged(snakemake.log[0], snakemake.threads):
    params = snakemake.params.start
    save_starting_model(params["plm"], params["pooling"], snakemake.output.model, params["passage_max_length"],
                        params["query_max_length"], params.get("query_prompt"), params.get("passage_prompt"))
    write_job_card(snakemake, "start", seed=None)
    write_job_manifest(snakemake, "start", seed=None)

import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.embedding import save_starting_model
from dpr_pipeline.workflow import logged, write_job_manifest

with logged(snakemake.log[0], snakemake.threads):
    params = snakemake.params.retriever
    save_starting_model(params["plm"], params["pooling"], snakemake.output.model, params["passage_max_length"],
                        params["query_max_length"], params.get("query_prompt"), params.get("passage_prompt"))
    write_job_manifest(snakemake, "start", seed=None, model_card=True)

import _hub_offline
_hub_offline.hub_as_started()  # this job downloads: the Hub as the job was started (before huggingface_hub loads)

from dpr_pipeline.models.hub_fetch import fetch_model  # noqa: E402
from dpr_pipeline.orchestration.job_log import logged  # noqa: E402

with logged(snakemake.log[0]):
    fetch_model(snakemake.params.repo_id, snakemake.output[0], revision=snakemake.params.revision)

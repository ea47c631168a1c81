import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.data.download import download_file
from dpr_pipeline.orchestration.job_log import logged

spec = snakemake.params.spec
with logged(snakemake.log[0]):
    download_file(spec["url"], snakemake.output[0], md5=spec.get("md5"), sha256=spec.get("sha256"),
                  headers=spec.get("headers"))

import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.download import download_file
from dpr_pipeline.workflow import logged

spec = snakemake.params.spec
with logged(snakemake.log[0]):
    download_file(spec["url"], snakemake.output[0], md5=spec.get("md5"), sha256=spec.get("sha256"),
                  headers=spec.get("headers"))

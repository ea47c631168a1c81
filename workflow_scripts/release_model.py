import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.model_card import write_release
from dpr_pipeline.score_fusion import read_fusion_weight
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0], snakemake.threads):
    weight = snakemake.params.fusion_weight
    if weight == "dev":
        weight = read_fusion_weight(snakemake.input.fusion[0])
    write_release(snakemake.input.model, snakemake.input.manifest, snakemake.input.metrics, snakemake.output[0],
                  fusion_weight=weight)

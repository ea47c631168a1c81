import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.model_card import write_release
from dpr_pipeline.score_fusion import resolved_weight
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0], snakemake.threads):
    setting = snakemake.params.fusion_weight  # None: a bi-encoder
    weight = None if setting is None else resolved_weight(setting, snakemake.input.fusion)
    write_release(snakemake.input.model, snakemake.input.manifest, snakemake.input.metrics, snakemake.output[0],
                  fusion_weight=weight)

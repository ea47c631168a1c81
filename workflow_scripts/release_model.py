import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.model_card import write_release
from dpr_pipeline.score_fusion import mixing_weight
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0], snakemake.threads):
    fusion_weight = snakemake.params.fusion_weight  # stage_settings.fusion's weight; None: a bi-encoder
    write_release(snakemake.input.model, snakemake.input.manifest, snakemake.input.metrics, snakemake.output[0],
                  fusion_weight=None if fusion_weight is None else mixing_weight(fusion_weight))

import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.evaluation.summary import write_summary
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    write_summary(dict(zip(snakemake.params.stages, snakemake.input.metrics)), snakemake.output.json,
                  snakemake.output.markdown, snakemake.output.png,
                  selections=dict(zip(snakemake.params.trained_biencoders, snakemake.input.selections)),
                  fusion_choice=snakemake.input.fusion_choice[0] if snakemake.input.fusion_choice else None)

import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.report.plots import plot_loss_curves
from dpr_pipeline.evaluation.summary import write_summary
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    methods = snakemake.params.methods
    write_summary(dict(zip(methods, snakemake.input.metrics)), snakemake.output.json, snakemake.output.markdown,
                  snakemake.output.png, labels={"none": "none (plm as is)"},
                  title="Pre-training ablation: Retriever₁ (BM25 negatives) fine-tuned from each method")
    plot_loss_curves(dict(zip([m for m in methods if m != "none"], snakemake.input.loss_logs)),
                     snakemake.output.loss_png, "Pre-training loss per method")

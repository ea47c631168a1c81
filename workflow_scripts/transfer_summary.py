import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.evaluation.transfer_summary import used_lengths, write_transfer_summary
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    # the input lists, per target in transfer_to order, its BM25 metrics then each transferred stage's
    columns = list(snakemake.params.stages)
    paths = list(snakemake.input.metrics)
    metrics_paths = {target: dict(zip(columns, paths[i * len(columns):(i + 1) * len(columns)]))
                     for i, target in enumerate(snakemake.params.targets)}
    # the transferred bi-encoders' folders, in their column order: the lengths they encoded each target at
    models = dict(zip(snakemake.params.biencoders, snakemake.input.models))
    lengths = used_lengths(dict(snakemake.params.lengths), models, snakemake.params.reranker_max_length)
    write_transfer_summary(snakemake.wildcards.dataset, metrics_paths, snakemake.params.metric,
                           snakemake.output.json, snakemake.output.markdown, snakemake.output.png, lengths)

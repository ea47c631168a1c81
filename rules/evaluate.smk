# Evaluation of any stage's TREC runs on the dataset's evaluation splits, and a plot for the report.


rule evaluate:
    input:
        unpack(evaluation_inputs),
        manifest="results/{dataset}/{stage}/manifest.json",
    output:
        "results/{dataset}/{stage}/metrics.json",
    params:
        # the evaluated dataset's settings (the transfer target's in transfer_evaluate, rules/transfer.smk)
        splits=lambda wc: evaluated_dataset(wc)["eval_splits"],
        metrics=dataset_metrics,
        relevance=relevance_of,
        relevance_levels=lambda wc: evaluated_dataset(wc).get("metric_relevance", {}),
        ignore_identical_ids=lambda wc: evaluated_dataset(wc)["ignore_identical_ids"],
    threads: threads_of("evaluate")
    resources:
        **resources_of("evaluate"),
    log:
        "results/{dataset}/logs/evaluate_{stage}.log",
    benchmark:
        "results/{dataset}/benchmarks/evaluate_{stage}.tsv"
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/evaluate.py"


rule plot_metrics:
    input:
        "results/{dataset}/{stage}/metrics.json",
    output:
        report(
            "results/{dataset}/{stage}/metrics.png",
            caption="../report/metrics.rst",
            category="{dataset}",
            subcategory="{stage}",
        ),
    threads: threads_of("plot_metrics")
    resources:
        **resources_of("plot_metrics"),
    log:
        "results/{dataset}/logs/plot_metrics_{stage}.log",
    benchmark:
        "results/{dataset}/benchmarks/plot_metrics_{stage}.tsv"
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/plot_metrics.py"

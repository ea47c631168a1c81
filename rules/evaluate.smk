# Evaluation of any stage's TREC runs on the dataset's evaluation splits, and a plot for the report.


rule evaluate:
    input:
        unpack(evaluation_inputs),
        manifest=stage_file("{stage}", "manifest.json"),
    output:
        stage_file("{stage}", "metrics.json"),
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
        log_file("evaluate_{stage}"),
    benchmark:
        benchmark_file("evaluate_{stage}")
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/evaluate.py"


rule plot_metrics:
    input:
        stage_file("{stage}", "metrics.json"),
    output:
        report(
            stage_file("{stage}", "metrics.png"),
            caption="../report/metrics.rst",
            category="{dataset}",
            subcategory="{stage}",
        ),
    threads: threads_of("plot_metrics")
    resources:
        **resources_of("plot_metrics"),
    log:
        log_file("plot_metrics_{stage}"),
    benchmark:
        benchmark_file("plot_metrics_{stage}")
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/plot_metrics.py"


rule release_model:
    # a stage's model folder ready to publish: its files hard-linked, and a model card with the stage's metrics
    # per split (the model folder's own card has none: metrics come after training). Not in the default target:
    # `snakemake results/<dataset>/<stage>/release`.
    input:
        model=model_dir("{stage}"),
        manifest=stage_file("{stage}", "manifest.json"),
        metrics=stage_file("{stage}", "metrics.json"),
        fusion=fusion_choice,
    output:
        directory(release_dir("{stage}")),
    wildcard_constraints:
        stage="|".join(BIENCODERS + CROSS_ENCODERS),
    params:
        fusion_weight=lambda wc: settings.fusion(config, wc.dataset)["weight"] if wc.stage in CROSS_ENCODERS else None,
    threads: threads_of("release_model")
    resources:
        **resources_of("release_model"),
    log:
        log_file("release_model_{stage}"),
    benchmark:
        benchmark_file("release_model_{stage}")
    conda:
        torch_env("release_model")
    script:
        "../workflow_scripts/release_model.py"

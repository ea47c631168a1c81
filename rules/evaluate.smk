# Every stage's run evaluated per split, and the per-dataset summary (SimLM Table 6's layout).


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
        # the evaluated stage's tracked run (`tracking`): not a plain value, so Snakemake's params trigger skips it
        tracking=lambda wc: tracking_run(config, wc.dataset, wc.stage),
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


rule summary:
    input:
        metrics=[stage_file(stage, "metrics.json") for stage in STAGES],
        # what each trained stage handed on, chosen on dev: the bi-encoders' choice, the re-ranker's fusion weight
        selections=[stage_file(stage, "dev_selection.json") for stage in stages.trained() if stage in BIENCODERS],
        fusion_choice=fusion_choice,
    output:
        json=dataset_file("summary.json"),
        markdown=dataset_file("summary.md"),
        png=report(
            dataset_file("summary.png"),
            caption="../report/summary.rst",
            category="{dataset}",
            subcategory="summary",
        ),
    params:
        stages=STAGES,
        trained_biencoders=[stage for stage in stages.trained() if stage in BIENCODERS],
    threads: threads_of("summary")
    resources:
        **resources_of("summary"),
    log:
        log_file("summary"),
    benchmark:
        benchmark_file("summary")
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/summary.py"

# What `snakemake --report` shows besides the stages' metric plots: each training stage's loss curve, the scores
# of positives vs mined negatives (BM25, Retriever1, Retriever2, teacher), every stage's metric table, and the
# throughput of encoding, search, re-ranking, teacher scoring and training from the jobs' benchmark files.


rule plot_training_loss:
    input:
        stage_file("{trained}", "loss_log.jsonl"),
    output:
        report(
            stage_file("{trained}", "loss_curve.png"),
            caption="../report/loss_curve.rst",
            category="{dataset}",
            subcategory="{trained}",
        ),
    wildcard_constraints:
        trained="|".join(TRAINED_STAGES + PRETRAINED_STAGES + ABLATION_STAGES),
    threads: threads_of("plot_training_loss")
    resources:
        **resources_of("plot_training_loss"),
    log:
        log_file("plot_training_loss_{trained}"),
    benchmark:
        benchmark_file("plot_training_loss_{trained}")
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/plot_training_loss.py"


rule metrics_table:
    input:
        stage_file("{stage}", "metrics.json"),
    output:
        report(
            stage_file("{stage}", "metrics.html"),
            caption="../report/metrics_table.rst",
            category="{dataset}",
            subcategory="{stage}",
        ),
    threads: threads_of("metrics_table")
    resources:
        **resources_of("metrics_table"),
    log:
        log_file("metrics_table_{stage}"),
    benchmark:
        benchmark_file("metrics_table_{stage}")
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/metrics_table.py"


rule score_distributions:
    input:
        # every mined stage's negatives (stages.py), then the teacher's scores of those the student distils
        **{stage: stage_file(stage, "negatives.parquet") for stage in stages.mined()},
        teacher=stage_file(stages.teacher(), "teacher_scores.parquet"),
    output:
        report(
            stage_file("report", "score_distributions.png"),
            caption="../report/score_distributions.rst",
            category="{dataset}",
            subcategory="negatives",
        ),
    threads: threads_of("score_distributions")
    resources:
        **resources_of("score_distributions"),
    log:
        log_file("score_distributions"),
    benchmark:
        benchmark_file("score_distributions")
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/score_distributions.py"


rule throughput:
    input:
        # the jobs' outputs (so their benchmark files exist) and the files that count what each processed
        outputs=lambda wc: [job["output"] for job in benchmarked_jobs(wc)],
        counted=lambda wc: list(
            dict.fromkeys(job["counted"] for job in benchmarked_jobs(wc) if job["counted"] != job["output"])
        ),
    output:
        tsv=stage_file("report", "throughput.tsv"),
        html=report(
            stage_file("report", "throughput.html"),
            caption="../report/throughput.rst",
            category="{dataset}",
            subcategory="throughput",
        ),
        png=report(
            stage_file("report", "throughput.png"),
            caption="../report/throughput.rst",
            category="{dataset}",
            subcategory="throughput",
        ),
    params:
        # benchmark files are not outputs of any rule: read them here, after the jobs that write them
        jobs=benchmarked_jobs,
    threads: threads_of("throughput")
    resources:
        **resources_of("throughput"),
    log:
        log_file("throughput"),
    benchmark:
        benchmark_file("throughput")
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/throughput.py"


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

# Cross-encoder re-ranker (Eq. 4) on Retriever2's negatives, re-ranking of Retriever2's runs, teacher scores
# (sharded), the distilled retriever (Eq. 5) and the per-dataset summary.


rule train_reranker:
    input:
        negatives="results/{dataset}/retriever2/negatives.parquet",
        corpus=data_file("corpus.parquet"),
        queries=train_queries,
    output:
        model=directory("results/{dataset}/reranker/model"),
        loss_log="results/{dataset}/reranker/loss_log.jsonl",
        manifest="results/{dataset}/reranker/manifest.json",
    params:
        reranker=params_of("reranker"),
        checkpoints=checkpoint_dir("reranker"),
    threads: threads_of("train_reranker")
    resources:
        **resources_of("train_reranker"),
    log:
        "results/{dataset}/logs/train_reranker.log",
    benchmark:
        "results/{dataset}/benchmarks/train_reranker.tsv"
    conda:
        "../envs/torch-gpu.yaml"
    script:
        "../workflow_scripts/train_reranker.py"


rule rerank:
    input:
        model="results/{dataset}/reranker/model",
        run="results/{dataset}/retriever2/run_{split}.trec",
        corpus=data_file("corpus.parquet"),
        queries=data_file("queries_{split}.parquet"),
    output:
        "results/{dataset}/reranker/run_{split}.trec",
    params:
        reranker=params_of("reranker"),
    threads: threads_of("rerank")
    resources:
        **resources_of("rerank"),
    log:
        "results/{dataset}/logs/rerank_{split}.log",
    benchmark:
        "results/{dataset}/benchmarks/rerank_{split}.tsv"
    conda:
        "../envs/torch-gpu.yaml"
    script:
        "../workflow_scripts/rerank.py"


rule teacher_scores_shard:
    input:
        model="results/{dataset}/reranker/model",
        negatives="results/{dataset}/retriever2/negatives.parquet",
        corpus=data_file("corpus.parquet"),
        queries=train_queries,
    output:
        "results/{dataset}/reranker/teacher/shard_{shard}.parquet",
    params:
        reranker=params_of("reranker"),
    threads: threads_of("teacher_scores_shard")
    resources:
        **resources_of("teacher_scores_shard"),
    log:
        "results/{dataset}/logs/teacher_scores_{shard}.log",
    benchmark:
        "results/{dataset}/benchmarks/teacher_scores_{shard}.tsv"
    conda:
        "../envs/torch-gpu.yaml"
    script:
        "../workflow_scripts/teacher_scores.py"


rule merge_teacher_scores:
    input:
        teacher_shards,
    output:
        "results/{dataset}/reranker/teacher_scores.parquet",
    threads: threads_of("merge_teacher_scores")
    resources:
        **resources_of("merge_teacher_scores"),
    log:
        "results/{dataset}/logs/merge_teacher_scores.log",
    benchmark:
        "results/{dataset}/benchmarks/merge_teacher_scores.tsv"
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/merge_teacher_scores.py"


rule train_distill:
    input:
        negatives="results/{dataset}/reranker/teacher_scores.parquet",
        corpus=data_file("corpus.parquet"),
        queries=train_queries,
        init=initialisation_input("distill"),
    output:
        model=directory("results/{dataset}/distill/model"),
        loss_log="results/{dataset}/distill/loss_log.jsonl",
        manifest="results/{dataset}/distill/manifest.json",
    params:
        distill=trained_params("distill"),
        checkpoints=checkpoint_dir("distill"),
    threads: threads_of("train_distill")
    resources:
        **resources_of("train_distill"),
    log:
        "results/{dataset}/logs/train_distill.log",
    benchmark:
        "results/{dataset}/benchmarks/train_distill.tsv"
    conda:
        "../envs/torch-gpu.yaml"
    script:
        "../workflow_scripts/train_distill.py"


rule summary:
    input:
        expand("results/{{dataset}}/{stage}/metrics.json", stage=STAGES),
    output:
        json="results/{dataset}/summary.json",
        markdown="results/{dataset}/summary.md",
        png=report(
            "results/{dataset}/summary.png",
            caption="../report/summary.rst",
            category="{dataset}",
            subcategory="summary",
        ),
    params:
        stages=STAGES,
    threads: threads_of("summary")
    resources:
        **resources_of("summary"),
    log:
        "results/{dataset}/logs/summary.log",
    benchmark:
        "results/{dataset}/benchmarks/summary.tsv"
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/summary.py"

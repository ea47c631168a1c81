# Cross-encoder re-ranker (Eq. 4) on Retriever2's negatives, re-ranking of Retriever2's runs (RERANKED: what feeds
# the re-ranker, src/dpr_pipeline/stages.py), teacher scores (sharded), the distilled retriever (Eq. 5) and the
# per-dataset summary.


rule train_reranker:
    input:
        negatives=stage_file(RERANKED, "negatives.parquet"),
        passages=data_file("passages.arrow"),
        queries=train_queries,
        init=fetched_inputs(reranker_plm),
    output:
        model=directory(stage_file("reranker", "model")),
        loss_log=stage_file("reranker", "loss_log.jsonl"),
        manifest=stage_file("reranker", "manifest.json"),
    params:
        reranker=lambda wc: settings.reranker(config, wc.dataset),
        checkpoints=checkpoint_dir("reranker"),
    threads: threads_of("train_reranker")
    resources:
        **resources_of("train_reranker"),
    log:
        log_file("train_reranker"),
    benchmark:
        benchmark_file("train_reranker")
    conda:
        torch_env("train_reranker")
    script:
        "../workflow_scripts/train_reranker.py"


rule rerank:
    input:
        model=stage_file("reranker", "model"),
        run=stage_file(RERANKED, "run_{split}.trec"),
        passages=data_file("passages.arrow"),
        queries=data_file("queries_{split}.parquet"),
    output:
        stage_file("reranker", "cross_encoder/run_{split}.trec"),
    params:
        # re-ranking a transfer target B's BM25 run ({target}, rules/transfer.smk) goes transfer.rerank_depth deep
        reranker=lambda wc: settings.reranker(config, wc.dataset, wc.get("target")),
    threads: threads_of("rerank")
    resources:
        **resources_of("rerank"),
    log:
        log_file("rerank_{split}"),
    benchmark:
        benchmark_file("rerank_{split}")
    conda:
        torch_env("rerank")
    script:
        "../workflow_scripts/rerank.py"


# The re-ranked runs mix the re-ranker's and Retriever2's scores (reranker.fusion_weight; 1: the re-ranker alone);
# `dev` chooses the weight on the dataset's dev split first.
rule choose_fusion_weight:
    input:
        unpack(fusion_choice_inputs),
    output:
        stage_file("reranker", "fusion_weight.json"),
    params:
        fusion=lambda wc: settings.fusion(config, wc.dataset),
    threads: threads_of("choose_fusion_weight")
    resources:
        **resources_of("choose_fusion_weight"),
    log:
        log_file("choose_fusion_weight"),
    benchmark:
        benchmark_file("choose_fusion_weight")
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/choose_fusion_weight.py"


rule fuse_reranked_run:
    input:
        unpack(fusion_inputs),
    output:
        stage_file("reranker", "run_{split}.trec"),
    params:
        fusion=lambda wc: settings.fusion(config, wc.dataset),
    threads: threads_of("fuse_reranked_run")
    resources:
        **resources_of("fuse_reranked_run"),
    log:
        log_file("fuse_reranked_run_{split}"),
    benchmark:
        benchmark_file("fuse_reranked_run_{split}")
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/fuse_reranked_run.py"


rule teacher_scores_shard:
    input:
        model=stage_file("reranker", "model"),
        negatives=stage_file(RERANKED, "negatives.parquet"),
        passages=data_file("passages.arrow"),
        queries=train_queries,
    output:
        stage_file("reranker", "teacher/shard_{shard}.parquet"),
    params:
        reranker=lambda wc: settings.reranker(config, wc.dataset),
        draws=lambda wc: settings.teacher_draws(config, wc.dataset),
    threads: threads_of("teacher_scores_shard")
    resources:
        **resources_of("teacher_scores_shard"),
    log:
        log_file("teacher_scores_{shard}"),
    benchmark:
        benchmark_file("teacher_scores_{shard}")
    conda:
        torch_env("teacher_scores_shard")
    script:
        "../workflow_scripts/teacher_scores.py"


rule merge_teacher_scores:
    input:
        teacher_shards,
    output:
        stage_file("reranker", "teacher_scores.parquet"),
    threads: threads_of("merge_teacher_scores")
    resources:
        **resources_of("merge_teacher_scores"),
    log:
        log_file("merge_teacher_scores"),
    benchmark:
        benchmark_file("merge_teacher_scores")
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/merge_teacher_scores.py"


rule train_distill:
    input:
        # the trained student or its start, whichever scores higher on the dev split (stages.selection)
        unpack(selection_inputs("distill")),
        negatives=stage_file(stages.stage("distill").teacher, "teacher_scores.parquet"),
        passages=data_file("passages.arrow"),
        queries=train_queries,
        init=initialisation_input("distill"),
    output:
        model=directory(stage_file("distill", "model")),
        loss_log=stage_file("distill", "loss_log.jsonl"),
        selection=stage_file("distill", "dev_selection.json"),
        manifest=stage_file("distill", "manifest.json"),
    params:
        distill=lambda wc: settings.biencoder(config, wc.dataset, "distill"),
        selection=lambda wc: settings.selection(config, wc.dataset, "distill"),
        checkpoints=checkpoint_dir("distill"),
    threads: threads_of("train_distill")
    resources:
        **resources_of("train_distill"),
    log:
        log_file("train_distill"),
    benchmark:
        benchmark_file("train_distill")
    conda:
        torch_env("train_distill")
    script:
        "../workflow_scripts/train_distill.py"


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

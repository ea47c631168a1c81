# The cross-encoder re-ranker (Eq. 4) trained on Retriever2's negatives, its re-ranking of the first stage's
# runs, and the fusion of its scores with the first stage's (the weight chosen on the dev split).


rule train_reranker:
    input:
        negatives=stage_file(RERANKED, "negatives.parquet"),
        passages=data_file("passages.arrow"),
        queries=train_queries,
        init=model_inputs(reranker_plm),
    output:
        model=directory(stage_file("reranker", "model")),
        loss_log=stage_file("reranker", "loss_log.jsonl"),
        manifest=stage_file("reranker", "manifest.json"),
    params:
        reranker=lambda wc: settings.train_reranker(config, wc.dataset),
        checkpoints=checkpoint_dir("reranker"),
        tracking=lambda wc: tracking_run(config, wc.dataset, "reranker"),
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
        reranker=lambda wc: settings.rerank(config, wc.dataset, wc.get("target")),
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

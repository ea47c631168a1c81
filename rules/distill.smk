# The distilled retriever (Eq. 5): the re-ranker's teacher scores of the mined pairs (sharded, then merged) and
# the student trained on them.


# distill.pseudo_queries: passages of the corpus each give a pseudo-query; Retriever2's top hits of it are its
# candidates, which the teacher scores with the train queries' (data/pseudo_queries.py)
rule pseudo_queries:
    input:
        data_file("corpus.parquet"),
    output:
        queries=stage_file("distill", "pseudo_queries/queries.parquet"),
        qrels=stage_file("distill", "pseudo_queries/qrels.parquet"),
    params:
        pseudo=lambda wc: settings.pseudo_queries(config, wc.dataset),
    threads: threads_of("pseudo_queries")
    resources:
        **resources_of("pseudo_queries"),
    log:
        log_file("pseudo_queries"),
    benchmark:
        benchmark_file("pseudo_queries")
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/pseudo_queries.py"


use rule dense_search as pseudo_query_dense_search with:
    input:
        model=stage_file(RERANKED, "model"),
        index=stage_file(RERANKED, "index.faiss"),
        ids=stage_file(RERANKED, "index_ids.parquet"),
        queries=stage_file("distill", "pseudo_queries/queries.parquet"),
    output:
        stage_file("distill", "pseudo_queries/run.trec"),
    params:
        search=lambda wc: settings.dense_search(config, wc.dataset, RERANKED),
        depth=lambda wc: settings.pseudo_query_mining(config, wc.dataset)["depth"],
        tag=f"dpr_pipeline-{RERANKED}",
    log:
        log_file("pseudo_query_dense_search"),
    benchmark:
        benchmark_file("pseudo_query_dense_search")


rule pseudo_query_negatives:
    input:
        run=stage_file("distill", "pseudo_queries/run.trec"),
        qrels=stage_file("distill", "pseudo_queries/qrels.parquet"),
        queries=stage_file("distill", "pseudo_queries/queries.parquet"),
        corpus=data_file("corpus.parquet"),
        negatives=stage_file(RERANKED, "negatives.parquet"),
        train_queries=train_queries,
    output:
        negatives=stage_file("distill", "pseudo_queries/negatives.parquet"),
        groups=stage_file("distill", "training_groups.parquet"),
        texts=stage_file("distill", "training_queries.parquet"),
    params:
        mining=lambda wc: settings.pseudo_query_mining(config, wc.dataset),
    threads: threads_of("pseudo_query_negatives")
    resources:
        **resources_of("pseudo_query_negatives"),
    log:
        log_file("pseudo_query_negatives"),
    benchmark:
        benchmark_file("pseudo_query_negatives")
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/pseudo_query_negatives.py"


rule teacher_scores_shard:
    input:
        model=stage_file("reranker", "model"),
        negatives=distill_groups,
        passages=data_file("passages.arrow"),
        queries=distill_queries,
    output:
        stage_file("reranker", "teacher/shard_{shard}.parquet"),
    params:
        reranker=lambda wc: settings.teacher_scores(config, wc.dataset),
        draws=lambda wc: settings.teacher_draws(config, wc.dataset),
    group:
        stages.shard_group("teacher_scores_shard")
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
        torch_env("merge_teacher_scores")  # it reads the shards with the teacher-score module (torch)
    script:
        "../workflow_scripts/merge_teacher_scores.py"


# distill.teacher: fused — the teacher's scores fused with Retriever2's, as the re-ranked runs fuse them
rule fuse_teacher_scores:
    input:
        unpack(fused_teacher_inputs),
    output:
        stage_file("reranker", TEACHER_SCORES["fused"]),
    params:
        fusion=lambda wc: settings.fusion(config, wc.dataset),
    threads: threads_of("fuse_teacher_scores")
    resources:
        **resources_of("fuse_teacher_scores"),
    log:
        log_file("fuse_teacher_scores"),
    benchmark:
        benchmark_file("fuse_teacher_scores")
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/fuse_teacher_scores.py"


rule train_distill:
    input:
        # the trained student or its start, whichever scores higher on the dev split (stages.selection)
        unpack(selection_inputs("distill")),
        negatives=distill_teacher_scores,
        passages=data_file("passages.arrow"),
        queries=distill_queries,
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
        tracking=lambda wc: tracking_run(config, wc.dataset, "distill"),
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

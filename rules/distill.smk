# The distilled retriever (Eq. 5): the re-ranker's teacher scores of the mined pairs (sharded, then merged) and
# the student trained on them.


rule teacher_scores_shard:
    input:
        model=stage_file("reranker", "model"),
        negatives=stage_file(RERANKED, "negatives.parquet"),
        passages=data_file("passages.arrow"),
        queries=train_queries,
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

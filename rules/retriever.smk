# Bi-encoder stages: the starting model (untrained), Retriever1 (BM25 negatives), Retriever2 (Retriever1's mined
# negatives) and the distilled retriever's encoding; corpus encoding in shards, a faiss index, dense runs and
# hard-negative mining.


rule starting_model:
    input:
        init=initialisation_input("start"),
    output:
        model=directory(stage_file("start", "model")),
        manifest=stage_file("start", "manifest.json"),
    params:
        start=lambda wc: settings.starting_model(config, wc.dataset),
    threads: threads_of("starting_model")
    resources:
        **resources_of("starting_model"),
    log:
        log_file("starting_model"),
    benchmark:
        benchmark_file("starting_model")
    conda:
        torch_env("starting_model")
    script:
        "../workflow_scripts/starting_model.py"


rule train_retriever:
    input:
        # the trained model or its start, whichever scores higher on the dev split (stages.selection)
        unpack(selection_inputs()),
        # the mined negatives of the stage that feeds it (stages.py): Retriever2 learns from Retriever1's,
        # Retriever1 and the ablation from BM25's
        negatives=lambda wc: stage_file(stages.stage(wc.stage).fed_by, "negatives.parquet", wc.dataset),
        passages=data_file("passages.arrow"),
        queries=train_queries,
        init=initialisation_input(),
    output:
        model=directory(stage_file("{stage}", "model")),
        loss_log=stage_file("{stage}", "loss_log.jsonl"),
        selection=stage_file("{stage}", "dev_selection.json"),
        manifest=stage_file("{stage}", "manifest.json"),
    wildcard_constraints:
        stage="|".join(stages.trained_by("train_retriever") + ABLATION_STAGES),
    params:
        retriever=lambda wc: settings.biencoder(config, wc.dataset, wc.stage),
        selection=lambda wc: settings.selection(config, wc.dataset, wc.stage),
        checkpoints=checkpoint_dir("{stage}"),
        tracking=lambda wc: tracking_run(config, wc.dataset, wc.stage),
    threads: threads_of("train_retriever")
    resources:
        **resources_of("train_retriever"),
    log:
        log_file("train_{stage}"),
    benchmark:
        benchmark_file("train_{stage}")
    conda:
        torch_env("train_retriever")
    script:
        "../workflow_scripts/train_retriever.py"


rule encode_corpus:
    input:
        model=stage_file("{stage}", "model"),
        corpus=data_file("corpus.parquet"),
    output:
        vectors=stage_file("{stage}", "embeddings/shard_{shard}.npy"),
        ids=stage_file("{stage}", "embeddings/shard_{shard}.ids.parquet"),
    wildcard_constraints:
        stage="|".join(BIENCODERS),
    params:
        # a transfer job ({target} B, rules/transfer.smk) encodes B's corpus with B's corpus-side settings
        encoding=lambda wc: settings.encode_corpus(config, wc.dataset, wc.stage, wc.get("target")),
    group:
        stages.shard_group("encode_corpus")
    threads: threads_of("encode_corpus")
    resources:
        **resources_of("encode_corpus"),
    log:
        log_file("encode_corpus_{stage}_{shard}"),
    benchmark:
        benchmark_file("encode_corpus_{stage}_{shard}")
    conda:
        torch_env("encode_corpus")
    script:
        "../workflow_scripts/encode_corpus.py"


rule build_index:
    input:
        unpack(encoded_shards),
    output:
        index=stage_file("{stage}", "index.faiss"),
        ids=stage_file("{stage}", "index_ids.parquet"),
    wildcard_constraints:
        stage="|".join(BIENCODERS),
    params:
        index=lambda wc: settings.dense_index(config, wc.dataset, wc.get("target")),
    threads: threads_of("build_index")
    resources:
        **resources_of("build_index"),
    log:
        log_file("build_index_{stage}"),
    benchmark:
        benchmark_file("build_index_{stage}")
    conda:
        torch_env("build_index")
    script:
        "../workflow_scripts/build_index.py"


rule dense_search:
    input:
        model=stage_file("{stage}", "model"),
        index=stage_file("{stage}", "index.faiss"),
        ids=stage_file("{stage}", "index_ids.parquet"),
        queries=data_file("queries_{split}.parquet"),
    output:
        stage_file("{stage}", "run_{split}.trec"),
    wildcard_constraints:
        stage="|".join(BIENCODERS),
    params:
        search=lambda wc: settings.dense_search(config, wc.dataset, wc.stage, wc.get("target")),
        depth=lambda wc: settings.search_depth(config, wc.dataset, wc.stage, wc.split, wc.get("target")),
    threads: threads_of("dense_search")
    resources:
        **resources_of("dense_search"),
    log:
        log_file("dense_search_{stage}_{split}"),
    benchmark:
        benchmark_file("dense_search_{stage}_{split}")
    conda:
        torch_env("dense_search")
    script:
        "../workflow_scripts/dense_search.py"


rule mine_hard_negatives:
    input:
        unpack(mining_answer_inputs),
        unpack(denoise_input()),   # mining.<stage>.denoise: the cross-encoder's scores of the pool
        run=lambda wc: stage_file(wc.stage, f"run_{train_split(wc)}.trec", wc.dataset),
        qrels=train_qrels,
        # the texts of the dropped-pair sample (and, relevance: answers, of the hits checked for an answer)
        queries=train_queries,
        corpus=data_file("corpus.parquet"),
    output:
        stage_file("{stage}", "negatives.parquet"),
        # what the filters (mining.<stage>: relative_margin, absolute_margin, max_score, range_min) dropped
        **negatives_filter_files("{stage}"),
    wildcard_constraints:
        stage="|".join(stages.mined(stages.BIENCODER)),
    params:
        # the mined bi-encoders (stages.py): Retriever1's negatives train Retriever2; Retriever2's feed the
        # re-ranker, the teacher scores and the distilled retriever (mining.retriever1, mining.retriever2).
        mining=lambda wc: settings.mining(config, wc.dataset, wc.stage),
        min_relevance=lambda wc: dataset_config(wc)["min_relevance"],
    threads: threads_of("mine_hard_negatives")
    resources:
        **resources_of("mine_hard_negatives"),
    log:
        log_file("mine_hard_negatives_{stage}"),
    benchmark:
        benchmark_file("mine_hard_negatives_{stage}")
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/mine_hard_negatives.py"


# mining.<stage>.denoise: a cross-encoder scores a mined stage's candidate pool (and its positives) on a GPU; the
# stage's mining job (mine_hard_negatives, bm25_negatives) drops the candidates it scores like positives.
rule denoise_pool:
    input:
        unpack(denoise_pool_inputs),
        pool=mining_pool,
        qrels=train_qrels,
    output:
        denoise_pool_file("{stage}"),
    wildcard_constraints:
        stage="|".join(stages.mined()),
    params:
        pool=lambda wc: settings.denoise_pool(config, wc.dataset, wc.stage),
        min_relevance=lambda wc: dataset_config(wc)["min_relevance"],
    threads: threads_of("denoise_pool")
    resources:
        **resources_of("denoise_pool"),
    log:
        log_file("denoise_pool_{stage}"),
    benchmark:
        benchmark_file("denoise_pool_{stage}")
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/denoise_pool.py"


rule denoise_scores:
    input:
        unpack(denoise_scores_inputs),
        pool=denoise_pool_file("{stage}"),
        passages=data_file("passages.arrow"),
        queries=train_queries,
    output:
        denoise_shard_file("{stage}", "{shard}"),
    wildcard_constraints:
        stage="|".join(stages.mined()),
    params:
        denoise=lambda wc: settings.denoise_scoring(config, wc.dataset, wc.stage),
    group:
        stages.shard_group("denoise_scores")
    threads: threads_of("denoise_scores")
    resources:
        **resources_of("denoise_scores"),
    log:
        log_file("denoise_scores_{stage}_{shard}"),
    benchmark:
        benchmark_file("denoise_scores_{stage}_{shard}")
    conda:
        torch_env("denoise_scores")
    script:
        "../workflow_scripts/denoise_scores.py"


rule merge_denoise_scores:
    input:
        denoise_shards,
    output:
        denoise_scores_file("{stage}"),
    wildcard_constraints:
        stage="|".join(stages.mined()),
    threads: threads_of("merge_denoise_scores")
    resources:
        **resources_of("merge_denoise_scores"),
    log:
        log_file("merge_denoise_scores_{stage}"),
    benchmark:
        benchmark_file("merge_denoise_scores_{stage}")
    conda:
        torch_env("merge_denoise_scores")
    script:
        "../workflow_scripts/merge_denoise_scores.py"

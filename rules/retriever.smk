# Bi-encoder stages: the starting model (untrained), Retriever1 (BM25 negatives), Retriever2 (Retriever1's mined
# negatives) and the distilled retriever's encoding; corpus encoding in shards, a faiss index, dense runs and
# hard-negative mining.


rule starting_model:
    input:
        init=initialisation_input("retriever"),
    output:
        model=directory("results/{dataset}/start/model"),
        manifest="results/{dataset}/start/manifest.json",
    params:
        retriever=trained_params("retriever"),
    threads: threads_of("starting_model")
    resources:
        **resources_of("starting_model"),
    log:
        "results/{dataset}/logs/starting_model.log",
    benchmark:
        "results/{dataset}/benchmarks/starting_model.tsv"
    conda:
        "../envs/torch.yaml"
    script:
        "../workflow_scripts/starting_model.py"


rule train_retriever:
    input:
        # Retriever2 learns from Retriever1's mined negatives; Retriever1 and the ablation from BM25's.
        negatives=lambda wc: (
            f"results/{wc.dataset}/retriever1/negatives.parquet"
            if wc.stage == "retriever2"
            else f"results/{wc.dataset}/bm25/negatives.parquet"
        ),
        corpus=data_file("corpus.parquet"),
        queries=train_queries,
        init=initialisation_input("retriever"),
    output:
        model=directory("results/{dataset}/{stage}/model"),
        loss_log="results/{dataset}/{stage}/loss_log.jsonl",
        manifest="results/{dataset}/{stage}/manifest.json",
    wildcard_constraints:
        stage="|".join(["retriever1", "retriever2"] + ABLATION_STAGES),
    params:
        retriever=trained_params("retriever"),
        checkpoints=checkpoint_dir("{stage}"),
    threads: threads_of("train_retriever")
    resources:
        **resources_of("train_retriever"),
    log:
        "results/{dataset}/logs/train_{stage}.log",
    benchmark:
        "results/{dataset}/benchmarks/train_{stage}.tsv"
    conda:
        "../envs/torch-gpu.yaml"
    script:
        "../workflow_scripts/train_retriever.py"


rule encode_corpus:
    input:
        model="results/{dataset}/{stage}/model",
        corpus=data_file("corpus.parquet"),
    output:
        vectors="results/{dataset}/{stage}/embeddings/shard_{shard}.npy",
        ids="results/{dataset}/{stage}/embeddings/shard_{shard}.ids.parquet",
    wildcard_constraints:
        stage="|".join(BIENCODERS),
    params:
        stage=biencoder_params,
        retriever=retriever_params,
    threads: threads_of("encode_corpus")
    resources:
        **resources_of("encode_corpus"),
    log:
        "results/{dataset}/logs/encode_corpus_{stage}_{shard}.log",
    benchmark:
        "results/{dataset}/benchmarks/encode_corpus_{stage}_{shard}.tsv"
    conda:
        "../envs/torch-gpu.yaml"
    script:
        "../workflow_scripts/encode_corpus.py"


rule build_index:
    input:
        unpack(encoded_shards),
    output:
        index="results/{dataset}/{stage}/index.faiss",
        ids="results/{dataset}/{stage}/index_ids.parquet",
    wildcard_constraints:
        stage="|".join(BIENCODERS),
    params:
        retriever=retriever_params,
    threads: threads_of("build_index")
    resources:
        **resources_of("build_index"),
    log:
        "results/{dataset}/logs/build_index_{stage}.log",
    benchmark:
        "results/{dataset}/benchmarks/build_index_{stage}.tsv"
    conda:
        "../envs/torch.yaml"
    script:
        "../workflow_scripts/build_index.py"


rule dense_search:
    input:
        model="results/{dataset}/{stage}/model",
        index="results/{dataset}/{stage}/index.faiss",
        ids="results/{dataset}/{stage}/index_ids.parquet",
        queries=data_file("queries_{split}.parquet"),
    output:
        "results/{dataset}/{stage}/run_{split}.trec",
    wildcard_constraints:
        stage="|".join(BIENCODERS),
    params:
        stage=biencoder_params,
        retriever=retriever_params,
        depth=search_depth("retriever", lambda wc: "retriever" if wc.stage == "retriever1" else "reranker"),
    threads: threads_of("dense_search")
    resources:
        **resources_of("dense_search"),
    log:
        "results/{dataset}/logs/dense_search_{stage}_{split}.log",
    benchmark:
        "results/{dataset}/benchmarks/dense_search_{stage}_{split}.tsv"
    conda:
        "../envs/torch-gpu.yaml"
    script:
        "../workflow_scripts/dense_search.py"


rule mine_hard_negatives:
    input:
        unpack(mining_answer_inputs),
        run=lambda wc: f"results/{wc.dataset}/{wc.stage}/run_{train_split(wc)}.trec",
        qrels=train_qrels,
    output:
        "results/{dataset}/{stage}/negatives.parquet",
    wildcard_constraints:
        stage="retriever1|retriever2",
    params:
        # Retriever1's negatives train Retriever2 (retriever settings); Retriever2's feed the re-ranker, the
        # teacher scores and the distilled retriever (reranker settings).
        mining=lambda wc: stage_params(
            config, wc.dataset, "retriever" if wc.stage == "retriever1" else "reranker"
        ),
        min_relevance=lambda wc: dataset_config(wc)["min_relevance"],
    threads: threads_of("mine_hard_negatives")
    resources:
        **resources_of("mine_hard_negatives"),
    log:
        "results/{dataset}/logs/mine_hard_negatives_{stage}.log",
    benchmark:
        "results/{dataset}/benchmarks/mine_hard_negatives_{stage}.tsv"
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/mine_hard_negatives.py"

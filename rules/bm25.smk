# BM25 with Pyserini: Lucene index, TREC runs for the train and evaluation splits, BM25 negatives.


rule bm25_index:
    input:
        corpus=data_file("corpus.parquet"),
    output:
        index=directory(stage_file("bm25", "index")),
        manifest=stage_file("bm25", "manifest.json"),
    params:
        bm25=lambda wc: settings.bm25(config, wc.dataset),
    threads: lambda wc: settings.bm25(config, wc.dataset)["threads"]
    resources:
        **resources_of("bm25_index"),
    log:
        log_file("bm25_index"),
    benchmark:
        benchmark_file("bm25_index")
    conda:
        "../envs/bm25.yaml"
    script:
        "../workflow_scripts/bm25_index.py"


rule bm25_search:
    input:
        index=stage_file("bm25", "index"),
        queries=data_file("queries_{split}.parquet"),
    output:
        stage_file("bm25", "run_{split}.trec"),
    params:
        bm25=lambda wc: settings.bm25(config, wc.dataset),
        depth=lambda wc: settings.search_depth(config, wc.dataset, "bm25", wc.split),
        ignore_identical_ids=lambda wc: dataset_config(wc)["ignore_identical_ids"],
    threads: lambda wc: settings.bm25(config, wc.dataset)["threads"]
    resources:
        **resources_of("bm25_search"),
    log:
        log_file("bm25_search_{split}"),
    benchmark:
        benchmark_file("bm25_search_{split}")
    conda:
        "../envs/bm25.yaml"
    script:
        "../workflow_scripts/bm25_search.py"


rule bm25_negatives:
    input:
        unpack(bm25_negatives_answer_inputs),
        unpack(denoise_input("bm25")),   # mining.bm25.denoise: the cross-encoder's scores of the pool
        pool=bm25_negatives_pool,
        qrels=train_qrels,
        queries=train_queries,
        corpus=data_file("corpus.parquet"),
    output:
        stage_file("bm25", "negatives.parquet"),
        **negatives_filter_files("bm25"),
    params:
        mining=lambda wc: settings.mining(config, wc.dataset, "bm25"),
        min_relevance=lambda wc: dataset_config(wc)["min_relevance"],
    threads: threads_of("bm25_negatives")
    resources:
        **resources_of("bm25_negatives"),
    log:
        log_file("bm25_negatives"),
    benchmark:
        benchmark_file("bm25_negatives")
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/bm25_negatives.py"

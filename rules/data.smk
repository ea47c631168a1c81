# Ingestion: raw dataset files (BEIR, MS MARCO, Parquet, DPR; ir_datasets exported as Parquet by rules/fetch.smk)
# -> checked Parquet artifacts (docs/artifacts.md).


rule ingest_corpus:
    input:
        lambda wc: raw_inputs(dataset_config(wc)),
    output:
        data_file("corpus.parquet"),
    params:
        format=lambda wc: raw_layout(dataset_config(wc)),
        root=lambda wc: dataset_config(wc)["path"],
        skip_empty_documents=lambda wc: dataset_config(wc)["skip_empty_documents"],
    threads: threads_of("ingest_corpus")
    resources:
        **resources_of("ingest_corpus"),
    log:
        log_file("ingest_corpus"),
    benchmark:
        benchmark_file("ingest_corpus")
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/ingest_corpus.py"


# The corpus's passage strings in one memory-mapped Arrow file that the training, re-ranking and teacher jobs
# share across their processes instead of each holding the corpus (src/dpr_pipeline/data/passage_store.py).
rule passage_store:
    input:
        data_file("corpus.parquet"),
    output:
        data_file("passages.arrow"),
    threads: threads_of("passage_store")
    resources:
        **resources_of("passage_store"),
    log:
        log_file("passage_store"),
    benchmark:
        benchmark_file("passage_store")
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/passage_store.py"


rule ingest_split:
    input:
        unpack(leakage_inputs),
        raw=lambda wc: raw_inputs(dataset_config(wc), raw_split(wc), split_files(wc)),
        corpus=data_file("corpus.parquet"),
    output:
        queries=data_file("queries_{split}.parquet"),
        qrels=data_file("qrels_{split}.parquet"),
        manifest=data_file("manifest_{split}.json"),
    params:
        format=lambda wc: raw_layout(dataset_config(wc)),
        root=lambda wc: dataset_config(wc)["path"],
        unknown_qrels_ids=lambda wc: dataset_config(wc)["unknown_qrels_ids"],
        files=split_files,
        # an evaluation split keeps judgements naming unknown documents (scored as trec_eval/BEIR do)
        evaluation=lambda wc: wc.split in eval_splits(wc)
        and wc.split != dataset_config(wc).get("train_split"),
        allow_overlap=lambda wc: dataset_config(wc)["allow_overlap"],
        min_relevance=lambda wc: dataset_config(wc)["min_relevance"],
        raw_split=raw_split,
        carve=lambda wc: carve_of(dataset_config(wc), wc.split),
    threads: threads_of("ingest_split")
    resources:
        **resources_of("ingest_split"),
    log:
        log_file("ingest_split_{split}"),
    benchmark:
        benchmark_file("ingest_split_{split}")
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/ingest_split.py"


rule ingest_official_negatives:
    input:
        negatives=lambda wc: with_downloads(
            dataset_config(wc), Path(dataset_config(wc)["path"]) / dataset_config(wc)["official_negatives"]
        )[0],
        qrels=train_qrels,
    output:
        data_file("official_negatives.parquet"),
    params:
        min_relevance=lambda wc: dataset_config(wc)["min_relevance"],
    threads: threads_of("ingest_official_negatives")
    resources:
        **resources_of("ingest_official_negatives"),
    log:
        log_file("ingest_official_negatives"),
    benchmark:
        benchmark_file("ingest_official_negatives")
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/ingest_official_negatives.py"


rule ingest_answers:
    input:
        lambda wc: raw_inputs(dataset_config(wc), wc.split, split_files(wc)),
    output:
        data_file("answers_{split}.parquet"),
    params:
        root=lambda wc: dataset_config(wc)["path"],
        files=split_files,
    threads: threads_of("ingest_answers")
    resources:
        **resources_of("ingest_answers"),
    log:
        log_file("ingest_answers_{split}"),
    benchmark:
        benchmark_file("ingest_answers_{split}")
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/ingest_answers.py"

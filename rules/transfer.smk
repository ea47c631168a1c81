# Zero-shot transfer (CDMAE Table 3, BEIR): the models trained on dataset A evaluated on each collection B in
# datasets.<A>.transfer_to, without training on B. Bi-encoders encode B's corpus, index it and search B's
# evaluation queries; the re-ranker re-ranks B's BM25 top `transfer.rerank_depth`; B's qrels and B's evaluation
# settings score them (the evaluate rule's script). Everything lives under results/{A}/{stage}/transfer/{B}/.
# First, transfer_leakage refuses B's evaluation queries that A trained on (identical text; B's allow_overlap).
# Bi-encoders encode B's queries and passages at B's `transfer_max_length` (null: each model's max_seq_length, as
# BEIR and MTEB do; settings.encoding hands it to the jobs), and the summary names the lengths used.
# The rules reuse the bi-encoder, re-ranker and evaluation rules with `use rule ... with:`, changing only files:
# the reused rules' params and input functions read B's settings from the {target} wildcard themselves.


wildcard_constraints:
    target="|".join(map(re.escape, config["datasets"])),


rule transfer_leakage:
    input:
        unpack(transfer_leakage_inputs),
    output:
        TRANSFER_LEAKAGE,
    params:
        splits=lambda wc: config["datasets"][wc.target]["eval_splits"],
        allow_overlap=lambda wc: config["datasets"][wc.target]["allow_overlap"],
    threads: threads_of("transfer_leakage")
    resources:
        **resources_of("transfer_leakage"),
    log:
        log_file("transfer_leakage_{target}"),
    benchmark:
        benchmark_file("transfer_leakage_{target}")
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/transfer_leakage.py"


use rule encode_corpus as transfer_encode_corpus with:
    input:
        model=stage_file("{stage}", "model"),
        corpus=data_file("corpus.parquet", "{target}"),
        leakage=TRANSFER_LEAKAGE,  # zero-shot: B's evaluation queries were not trained on (checked first)
    output:
        vectors=stage_file("{stage}", "transfer/{target}/embeddings/shard_{shard}.npy"),
        ids=stage_file("{stage}", "transfer/{target}/embeddings/shard_{shard}.ids.parquet"),
    group:
        stages.shard_group("transfer_encode_corpus")
    log:
        log_file("transfer_encode_corpus_{stage}_{target}_{shard}"),
    benchmark:
        benchmark_file("transfer_encode_corpus_{stage}_{target}_{shard}")


use rule build_index as transfer_build_index with:
    output:
        index=stage_file("{stage}", "transfer/{target}/index.faiss"),
        ids=stage_file("{stage}", "transfer/{target}/index_ids.parquet"),
    log:
        log_file("transfer_build_index_{stage}_{target}"),
    benchmark:
        benchmark_file("transfer_build_index_{stage}_{target}")


use rule dense_search as transfer_dense_search with:
    input:
        model=stage_file("{stage}", "model"),
        index=stage_file("{stage}", "transfer/{target}/index.faiss"),
        ids=stage_file("{stage}", "transfer/{target}/index_ids.parquet"),
        queries=data_file("queries_{split}.parquet", "{target}"),
    output:
        stage_file("{stage}", "transfer/{target}/run_{split}.trec"),
    log:
        log_file("transfer_dense_search_{stage}_{target}_{split}"),
    benchmark:
        benchmark_file("transfer_dense_search_{stage}_{target}_{split}")


use rule rerank as transfer_rerank with:
    input:
        model=stage_file("reranker", "model"),
        run=stage_file("bm25", "run_{split}.trec", "{target}"),
        passages=data_file("passages.arrow", "{target}"),
        queries=data_file("queries_{split}.parquet", "{target}"),
        leakage=TRANSFER_LEAKAGE,
    output:
        stage_file("reranker", "transfer/{target}/run_{split}.trec"),
    log:
        log_file("transfer_rerank_{target}_{split}"),
    benchmark:
        benchmark_file("transfer_rerank_{target}_{split}")


# The evaluate rule's inputs and params follow the evaluated dataset (evaluated_dataset: B here; its qrels or
# answers), so only the output changes: a new evaluation setting of evaluate applies to transfer too. The
# metrics name the stage's manifest, results/{A}/{stage}/manifest.json.
use rule evaluate as transfer_evaluate with:
    output:
        stage_file("{stage}", "transfer/{target}/metrics.json"),
    wildcard_constraints:
        stage="|".join(BIENCODERS + CROSS_ENCODERS),
    log:
        log_file("transfer_evaluate_{stage}_{target}"),
    benchmark:
        benchmark_file("transfer_evaluate_{stage}_{target}")


rule transfer_summary:
    input:
        metrics=transfer_metrics,
        models=transfer_models,  # the transferred bi-encoders' folders: the lengths they encoded each target at
    output:
        json=dataset_file("transfer_summary.json"),
        markdown=dataset_file("transfer_summary.md"),
        png=report(
            dataset_file("transfer_summary.png"),
            caption="../report/transfer.rst",
            category="{dataset}",
            subcategory="transfer",
        ),
    params:
        targets=lambda wc: dataset_config(wc)["transfer_to"],
        stages=["bm25"] + config["transfer"]["stages"],
        metric=config["transfer"]["metric"],
        biencoders=[stage for stage in config["transfer"]["stages"] if stage in BIENCODERS],
        lengths=lambda wc: {target: settings.transfer_max_length(config, target)
                            for target in dataset_config(wc)["transfer_to"]},
        # the re-ranker scores B's pairs at A's reranker.max_length
        reranker_max_length=lambda wc: (settings.reranker(config, wc.dataset)["max_length"]
                                        if "reranker" in config["transfer"]["stages"] else None),
    threads: threads_of("transfer_summary")
    resources:
        **resources_of("transfer_summary"),
    log:
        log_file("transfer_summary"),
    benchmark:
        benchmark_file("transfer_summary")
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/transfer_summary.py"

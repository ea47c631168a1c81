# Pre-training on the target corpus (SimLM §3.1 and the methods it is compared with): token-id shards, corpus
# n-gram statistics (CDMAE only), one encoder per method, and the ablation of SimLM's Table 7: Retriever1
# fine-tuned with BM25 negatives from each method's encoder (rules train_retriever ... evaluate, stage
# ablation/{method}), summarised side by side.


rule tokenize_corpus:
    input:
        corpus=data_file("corpus.parquet"),
    output:
        "results/{dataset}/tokens/part_{shard}.parquet",
    params:
        pretrain=params_of("pretrain"),
    threads: threads_of("tokenize_corpus")
    resources:
        **resources_of("tokenize_corpus"),
    log:
        "results/{dataset}/logs/tokenize_corpus_{shard}.log",
    benchmark:
        "results/{dataset}/benchmarks/tokenize_corpus_{shard}.tsv"
    conda:
        "../envs/torch.yaml"
    script:
        "../workflow_scripts/tokenize_corpus.py"


rule count_ngrams:
    input:
        token_shards,
    output:
        "results/{dataset}/tokens/ngram_counts.npz",
    params:
        pretrain=params_of("pretrain"),
    threads: threads_of("count_ngrams")
    resources:
        **resources_of("count_ngrams"),
    log:
        "results/{dataset}/logs/count_ngrams.log",
    benchmark:
        "results/{dataset}/benchmarks/count_ngrams.tsv"
    conda:
        "../envs/torch.yaml"
    script:
        "../workflow_scripts/count_ngrams.py"


rule pretrain:
    input:
        tokens=token_shards,
        ngram_counts=lambda wc: (
            [f"results/{wc.dataset}/tokens/ngram_counts.npz"] if wc.method == "cdmae" else []
        ),
    output:
        model=directory("results/{dataset}/pretrain/{method}/model"),
        loss_log="results/{dataset}/pretrain/{method}/loss_log.jsonl",
        manifest="results/{dataset}/pretrain/{method}/manifest.json",
    params:
        pretrain=pretrain_params,
        checkpoints=checkpoint_dir("pretrain/{method}"),
    threads: threads_of("pretrain")
    resources:
        **resources_of("pretrain"),
    log:
        "results/{dataset}/logs/pretrain_{method}.log",
    benchmark:
        "results/{dataset}/benchmarks/pretrain_{method}.tsv"
    conda:
        "../envs/torch.yaml"
    script:
        "../workflow_scripts/pretrain.py"


rule ablation_summary:
    input:
        metrics=lambda wc: expand(
            "results/{dataset}/ablation/{method}/metrics.json",
            dataset=wc.dataset,
            method=ablation_methods(wc),
        ),
        loss_logs=lambda wc: expand(
            "results/{dataset}/pretrain/{method}/loss_log.jsonl",
            dataset=wc.dataset,
            method=[m for m in ablation_methods(wc) if m != "none"],
        ),
    output:
        json="results/{dataset}/ablation/summary.json",
        markdown="results/{dataset}/ablation/summary.md",
        png=report(
            "results/{dataset}/ablation/summary.png",
            caption="../report/ablation.rst",
            category="{dataset}",
            subcategory="pre-training ablation",
        ),
        loss_png=report(
            "results/{dataset}/ablation/pretraining_loss.png",
            caption="../report/pretraining_loss.rst",
            category="{dataset}",
            subcategory="pre-training ablation",
        ),
    params:
        methods=ablation_methods,
    threads: threads_of("ablation_summary")
    resources:
        **resources_of("ablation_summary"),
    log:
        "results/{dataset}/logs/ablation_summary.log",
    benchmark:
        "results/{dataset}/benchmarks/ablation_summary.tsv"
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/ablation_summary.py"

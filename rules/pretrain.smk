# Pre-training on the target corpus (SimLM §3.1 and the methods it is compared with): token-id shards, corpus
# n-gram statistics (CDMAE only), one encoder per method, and the ablation of SimLM's Table 7: Retriever1
# fine-tuned with BM25 negatives from each method's encoder (rules train_retriever ... evaluate, stage
# ablation/{method}), summarised side by side. What a method needs is asked of its declaration (pretraining/methods.py).
from dpr_pipeline.pretraining.methods import pretraining_method

# A method's pre-trained encoder and its ablation row: the families' members (stages.member), as rule patterns.
PRETRAINED = stages.member(stages.PRETRAINING, "{method}")
ABLATED = stages.member(stages.ABLATION, "{method}")


rule pretraining_start:
    input:
        plm=model_inputs(lambda wc: settings.pretraining_start(config, wc.dataset)["plm"]),
    output:
        model=directory(stage_file(PRETRAINING_START, "model")),
    params:
        start=lambda wc: settings.pretraining_start(config, wc.dataset),
    threads: threads_of("pretraining_start")
    resources:
        **resources_of("pretraining_start"),
    log:
        log_file("pretraining_start"),
    benchmark:
        benchmark_file("pretraining_start")
    conda:
        torch_env("pretraining_start")
    script:
        "../workflow_scripts/pretraining_start.py"


rule tokenize_corpus:
    input:
        corpus=data_file("corpus.parquet"),
        plm=model_inputs(pretrain_plm),
    output:
        stage_file("tokens", "part_{shard}.arrow"),
    params:
        pretrain=lambda wc: settings.tokenize_corpus(config, wc.dataset),
    threads: threads_of("tokenize_corpus")
    resources:
        **resources_of("tokenize_corpus"),
    log:
        log_file("tokenize_corpus_{shard}"),
    benchmark:
        benchmark_file("tokenize_corpus_{shard}")
    conda:
        torch_env("tokenize_corpus")
    script:
        "../workflow_scripts/tokenize_corpus.py"


rule count_ngrams:
    input:
        tokens=token_shards,
        plm=model_inputs(pretrain_plm),
    output:
        stage_file("tokens", "ngram_counts.npz"),
    params:
        pretrain=lambda wc: settings.count_ngrams(config, wc.dataset),
    threads: threads_of("count_ngrams")
    resources:
        **resources_of("count_ngrams"),
    log:
        log_file("count_ngrams"),
    benchmark:
        benchmark_file("count_ngrams")
    conda:
        torch_env("count_ngrams")
    script:
        "../workflow_scripts/count_ngrams.py"


rule pretrain:
    input:
        tokens=token_shards,
        ngram_counts=lambda wc: (
            [stage_file("tokens", "ngram_counts.npz", wc.dataset)]
            if pretraining_method(wc.method).ngram_counts
            else []
        ),
        models=model_inputs(pretrain_plm, pretrain_generator),
    output:
        model=directory(stage_file(PRETRAINED, "model")),
        loss_log=stage_file(PRETRAINED, "loss_log.jsonl"),
        manifest=stage_file(PRETRAINED, "manifest.json"),
    params:
        pretrain=lambda wc: settings.pretrain(config, wc.dataset, wc.method),
        checkpoints=checkpoint_dir(PRETRAINED),
        tracking=lambda wc: tracking_run(config, wc.dataset, stages.member(stages.PRETRAINING, wc.method)),
    threads: threads_of("pretrain")
    resources:
        **resources_of("pretrain"),
    log:
        log_file("pretrain_{method}"),
    benchmark:
        benchmark_file("pretrain_{method}")
    conda:
        torch_env("pretrain")
    script:
        "../workflow_scripts/pretrain.py"


rule ablation_summary:
    input:
        metrics=lambda wc: expand(
            stage_file(ABLATED, "metrics.json"),
            dataset=wc.dataset,
            method=ablation_methods(wc),
        ),
        loss_logs=lambda wc: expand(
            stage_file(PRETRAINED, "loss_log.jsonl"),
            dataset=wc.dataset,
            method=[m for m in ablation_methods(wc) if m != "none"],
        ),
    output:
        json=stage_file(stages.ABLATION.name, "summary.json"),
        markdown=stage_file(stages.ABLATION.name, "summary.md"),
        png=report(
            stage_file(stages.ABLATION.name, "summary.png"),
            caption="../report/ablation.rst",
            category="{dataset}",
            subcategory="pre-training ablation",
        ),
        loss_png=report(
            stage_file(stages.ABLATION.name, "pretraining_loss.png"),
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
        log_file("ablation_summary"),
    benchmark:
        benchmark_file("ablation_summary")
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/ablation_summary.py"

# What `snakemake --report` shows besides the stages' metric plots: each training stage's loss curve, the scores
# of positives vs mined negatives (BM25, Retriever1, Retriever2, teacher), every stage's metric table, and the
# throughput of encoding, search, re-ranking, teacher scoring and training from the jobs' benchmark files.

# Training stages with a loss_log.jsonl: the main chain, each pre-training method, each ablation Retriever1.
TRAINED_STAGES = ["retriever1", "retriever2", "reranker", "distill"]


def pretraining_in_chain(dataset):
    """The pre-training methods the main chain trains: pretrain.method when a bi-encoder starts from it."""
    uses = [stage_params(config, dataset, stage)["plm"] == "pretrain" for stage in ("retriever", "distill")]
    return [f"pretrain/{stage_params(config, dataset, 'pretrain')['method']}"] if any(uses) else []


def report_targets(dataset):
    """The report's files of a dataset (part of the default target)."""
    stages = TRAINED_STAGES + pretraining_in_chain(dataset)
    return ([f"results/{dataset}/{stage}/loss_curve.png" for stage in stages]
            + [f"results/{dataset}/{stage}/metrics.html" for stage in STAGES]
            + [f"results/{dataset}/report/score_distributions.png"]
            + [f"results/{dataset}/report/throughput.{ext}" for ext in ("tsv", "html", "png")])


def benchmarked_jobs(wildcards):
    """The jobs whose throughput the report shows, with what each processed (see src/dpr_pipeline/throughput.py):
    corpus encoding (passages), BM25 and dense search and re-ranking (queries), teacher scoring (query-passage
    pairs), training (steps). ``output``: a file the job writes, so this rule runs after it and its benchmark."""
    ds = wildcards.dataset
    root, bench = f"results/{ds}", f"results/{ds}/benchmarks"
    train, evals = train_split(wildcards), eval_splits(wildcards)
    with_train = list(dict.fromkeys([train] + evals))
    jobs = []
    for stage in ["retriever1", "retriever2", "distill"]:
        for shard in range(retriever_params(wildcards)["encode_shards"]):
            ids = f"{root}/{stage}/embeddings/shard_{shard}.ids.parquet"
            jobs.append({"task": "corpus encoding", "job": f"{stage} shard {shard}", "unit": "passages",
                         "benchmark": f"{bench}/encode_corpus_{stage}_{shard}.tsv", "output": ids, "counted": ids})
    bm25_splits = evals if "official_negatives" in dataset_config(wildcards) else with_train
    searches = [("BM25 search", "bm25", "bm25_search_", bm25_splits)] + [
        ("dense search", stage, f"dense_search_{stage}_", with_train if stage != "distill" else evals)
        for stage in ["retriever1", "retriever2", "distill"]]
    for task, stage, prefix, splits in searches:
        for split in splits:
            jobs.append({"task": task, "job": split if stage == "bm25" else f"{stage} {split}", "unit": "queries",
                         "benchmark": f"{bench}/{prefix}{split}.tsv", "output": f"{root}/{stage}/run_{split}.trec",
                         "counted": f"{root}/data/queries_{split}.parquet"})
    for split in evals:
        jobs.append({"task": "re-ranking", "job": split, "unit": "queries", "benchmark": f"{bench}/rerank_{split}.tsv",
                     "output": f"{root}/reranker/run_{split}.trec", "counted": f"{root}/data/queries_{split}.parquet"})
    for shard, path in enumerate(teacher_shards(wildcards)):
        jobs.append({"task": "teacher scoring", "job": f"shard {shard}", "unit": "query-passage pairs",
                     "benchmark": f"{bench}/teacher_scores_{shard}.tsv", "output": path, "counted": path})
    for stage in TRAINED_STAGES + pretraining_in_chain(ds):
        log_file = f"{root}/{stage}/loss_log.jsonl"
        name = {"reranker": "train_reranker", "distill": "train_distill"}.get(stage, f"train_{stage}")
        if stage.startswith("pretrain/"):
            name = f"pretrain_{stage.split('/', 1)[1]}"
        jobs.append({"task": "training", "job": stage, "unit": "steps", "benchmark": f"{bench}/{name}.tsv",
                     "output": log_file, "counted": log_file})
    return jobs


rule plot_training_loss:
    input:
        "results/{dataset}/{trained}/loss_log.jsonl",
    output:
        report(
            "results/{dataset}/{trained}/loss_curve.png",
            caption="../report/loss_curve.rst",
            category="{dataset}",
            subcategory="{trained}",
        ),
    wildcard_constraints:
        trained="|".join(TRAINED_STAGES + [f"pretrain/{m}" for m in PRETRAIN_METHODS] + ABLATION_STAGES),
    threads: threads_of("plot_training_loss")
    resources:
        **resources_of("plot_training_loss"),
    log:
        "results/{dataset}/logs/plot_training_loss_{trained}.log",
    benchmark:
        "results/{dataset}/benchmarks/plot_training_loss_{trained}.tsv"
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/plot_training_loss.py"


rule metrics_table:
    input:
        "results/{dataset}/{stage}/metrics.json",
    output:
        report(
            "results/{dataset}/{stage}/metrics.html",
            caption="../report/metrics_table.rst",
            category="{dataset}",
            subcategory="{stage}",
        ),
    threads: threads_of("metrics_table")
    resources:
        **resources_of("metrics_table"),
    log:
        "results/{dataset}/logs/metrics_table_{stage}.log",
    benchmark:
        "results/{dataset}/benchmarks/metrics_table_{stage}.tsv"
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/metrics_table.py"


rule score_distributions:
    input:
        bm25="results/{dataset}/bm25/negatives.parquet",
        retriever1="results/{dataset}/retriever1/negatives.parquet",
        retriever2="results/{dataset}/retriever2/negatives.parquet",
        teacher="results/{dataset}/reranker/teacher_scores.parquet",
    output:
        report(
            "results/{dataset}/report/score_distributions.png",
            caption="../report/score_distributions.rst",
            category="{dataset}",
            subcategory="negatives",
        ),
    threads: threads_of("score_distributions")
    resources:
        **resources_of("score_distributions"),
    log:
        "results/{dataset}/logs/score_distributions.log",
    benchmark:
        "results/{dataset}/benchmarks/score_distributions.tsv"
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/score_distributions.py"


rule throughput:
    input:
        # the jobs' outputs (so their benchmark files exist) and the files that count what each processed
        outputs=lambda wc: [job["output"] for job in benchmarked_jobs(wc)],
        counted=lambda wc: list(
            dict.fromkeys(job["counted"] for job in benchmarked_jobs(wc) if job["counted"] != job["output"])
        ),
    output:
        tsv="results/{dataset}/report/throughput.tsv",
        html=report(
            "results/{dataset}/report/throughput.html",
            caption="../report/throughput.rst",
            category="{dataset}",
            subcategory="throughput",
        ),
        png=report(
            "results/{dataset}/report/throughput.png",
            caption="../report/throughput.rst",
            category="{dataset}",
            subcategory="throughput",
        ),
    params:
        # benchmark files are not outputs of any rule: read them here, after the jobs that write them
        jobs=benchmarked_jobs,
    threads: threads_of("throughput")
    resources:
        **resources_of("throughput"),
    log:
        "results/{dataset}/logs/throughput.log",
    benchmark:
        "results/{dataset}/benchmarks/throughput.tsv"
    conda:
        "../envs/eval.yaml"
    script:
        "../workflow_scripts/throughput.py"

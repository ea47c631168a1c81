# What the default target and the report build: every stage's metrics and summary per run_datasets entry, the
# report's plots and tables, and the jobs whose benchmark files the throughput table reads.


def final_targets():
    """What `snakemake` with no target builds: every stage's metrics and the summary, per run_datasets entry, and
    the report's files."""
    targets = []
    for dataset in config["run_datasets"]:
        if "train_split" not in config["datasets"][dataset]:  # evaluation-only: BM25 is all it has of its own
            targets.append(stage_file("bm25", "metrics.png", dataset))
            continue
        targets += [stage_file(stage, "metrics.png", dataset) for stage in STAGES]
        targets += [dataset_file(f"summary.{ext}", dataset) for ext in ("json", "md", "png")]
        targets += report_targets(dataset)  # rules/report.smk: loss curves, metric tables, scores, throughput
        if config["datasets"][dataset]["transfer_to"]:
            targets += [dataset_file(f"transfer_summary.{ext}", dataset) for ext in ("json", "md", "png")]
    return targets


# The report (rules/report.smk): what it plots and which jobs' benchmark files it reads.
# Training stages with a loss_log.jsonl: the main chain, each pre-training method, each ablation Retriever1.
TRAINED_STAGES = ["retriever1", "retriever2", "reranker", "distill"]


def pretraining_in_chain(dataset):
    """The pre-training methods the main chain trains: pretrain.method when a bi-encoder starts from it."""
    uses = [stage_params(config, dataset, stage)["plm"] == "pretrain" for stage in ("retriever", "distill")]
    return [f"pretrain/{stage_params(config, dataset, 'pretrain')['method']}"] if any(uses) else []


def report_targets(dataset):
    """The report's files of a dataset (part of the default target)."""
    stages = TRAINED_STAGES + pretraining_in_chain(dataset)
    return ([stage_file(stage, "loss_curve.png", dataset) for stage in stages]
            + [stage_file(stage, "metrics.html", dataset) for stage in STAGES]
            + [stage_file("report", "score_distributions.png", dataset)]
            + [stage_file("report", f"throughput.{ext}", dataset) for ext in ("tsv", "html", "png")])


def benchmarked_jobs(wildcards):
    """The jobs whose throughput the report shows, with what each processed (see src/dpr_pipeline/throughput.py):
    corpus encoding (passages), BM25 and dense search and re-ranking (queries), teacher scoring (query-passage
    pairs), training (steps). ``output``: a file the job writes, so this rule runs after it and its benchmark."""
    ds = wildcards.dataset
    train, evals = train_split(wildcards), eval_splits(wildcards)
    with_train = list(dict.fromkeys([train] + evals))
    jobs = []
    for stage in ["start", "retriever1", "retriever2", "distill"]:
        for shard in range(retriever_params(wildcards)["encode_shards"]):
            ids = stage_file(stage, f"embeddings/shard_{shard}.ids.parquet", ds)
            jobs.append({"task": "corpus encoding", "job": f"{stage} shard {shard}", "unit": "passages",
                         "benchmark": benchmark_file(f"encode_corpus_{stage}_{shard}", ds), "output": ids,
                         "counted": ids})
    bm25_splits = evals if "official_negatives" in dataset_config(wildcards) else with_train
    searches = [("BM25 search", "bm25", "bm25_search_", bm25_splits)] + [
        ("dense search", stage, f"dense_search_{stage}_", with_train if stage in ("retriever1", "retriever2") else evals)
        for stage in ["start", "retriever1", "retriever2", "distill"]]
    for task, stage, prefix, splits in searches + [("re-ranking", "reranker", "rerank_", evals)]:
        for split in splits:
            jobs.append({"task": task, "job": split if stage in ("bm25", "reranker") else f"{stage} {split}",
                         "unit": "queries", "benchmark": benchmark_file(f"{prefix}{split}", ds),
                         "output": stage_file(stage, f"run_{split}.trec", ds),
                         "counted": data_file(f"queries_{split}.parquet", ds)})
    for shard, path in enumerate(teacher_shards(wildcards)):
        jobs.append({"task": "teacher scoring", "job": f"shard {shard}", "unit": "query-passage pairs",
                     "benchmark": benchmark_file(f"teacher_scores_{shard}", ds), "output": path, "counted": path})
    for stage in TRAINED_STAGES + pretraining_in_chain(ds):
        loss_log = stage_file(stage, "loss_log.jsonl", ds)
        name = {"reranker": "train_reranker", "distill": "train_distill"}.get(stage, f"train_{stage}")
        if stage.startswith("pretrain/"):
            name = f"pretrain_{stage.split('/', 1)[1]}"
        jobs.append({"task": "training", "job": stage, "unit": "steps", "benchmark": benchmark_file(name, ds),
                     "output": loss_log, "counted": loss_log})
    return jobs

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
# Training stages with a loss_log.jsonl: the main chain's (declared in src/dpr_pipeline/stages.py); the report
# adds each pre-training method and each ablation Retriever1.
TRAINED_STAGES = stages.trained()


def report_targets(dataset):
    """The report's files of a dataset (part of the default target)."""
    trained = TRAINED_STAGES + settings.pretraining_in_chain(config, dataset)
    return ([stage_file(stage, "loss_curve.png", dataset) for stage in trained]
            + [stage_file(stage, "metrics.html", dataset) for stage in STAGES]
            + [stage_file("report", "score_distributions.png", dataset)]
            + [stage_file("report", f"throughput.{ext}", dataset) for ext in ("tsv", "html", "png")])


def rule_job(rule, task, label, unit, output=0, counted=None, **wildcards):
    """One row of the throughput table: the job of ``rules.<name>`` with ``wildcards``, with the benchmark file
    and the ``output`` (index or name) its declaration names, and the file that counts the ``unit`` it processed
    (``counted``, else that output)."""
    path = lambda pattern: expand(str(pattern), **wildcards)[0]
    output = path(rule.output[output] if isinstance(output, int) else getattr(rule.output, output))
    return {"task": task, "job": label, "unit": unit, "benchmark": path(rule.benchmark), "output": output,
            "counted": counted or output}


def benchmarked_jobs(wildcards):
    """The jobs whose throughput the report shows, with what each processed (see src/dpr_pipeline/report/throughput.py):
    corpus encoding (passages), BM25 and dense search and re-ranking (queries), teacher scoring (query-passage
    pairs), training (steps). ``output``: a file the job writes, so the throughput job runs after it and its
    benchmark file."""
    ds = wildcards.dataset
    train, evals = train_split(wildcards), eval_splits(wildcards)
    with_train = list(dict.fromkeys([train] + evals))
    queries = lambda split: data_file(f"queries_{split}.parquet", ds)
    biencoders, mined = stages.chain(stages.BIENCODER), stages.mined(stages.BIENCODER)  # mined: train runs too
    jobs = [rule_job(rules.encode_corpus, "corpus encoding", f"{stage} shard {shard}", "passages", "ids",
                     dataset=ds, stage=stage, shard=shard)
            for stage in biencoders for shard in range(settings.encoding(config, ds)["encode_shards"])]
    bm25_splits = evals if "official_negatives" in dataset_config(wildcards) else with_train
    jobs += [rule_job(rules.bm25_search, "BM25 search", split, "queries", counted=queries(split), dataset=ds,
                      split=split) for split in bm25_splits]
    jobs += [rule_job(rules.dense_search, "dense search", f"{stage} {split}", "queries", counted=queries(split),
                      dataset=ds, stage=stage, split=split)
             for stage in biencoders for split in (with_train if stage in mined else evals)]
    jobs += [rule_job(rules.rerank, "re-ranking", split, "queries", counted=queries(split), dataset=ds, split=split)
             for split in evals]
    jobs += [rule_job(rules.teacher_scores_shard, "teacher scoring", f"shard {shard}", "query-passage pairs",
                      dataset=ds, shard=shard)
             for shard in range(settings.reranker(config, ds)["teacher_shards"])]
    training = {stage: (getattr(rules, stages.stage(stage).trainer), {"stage": stage}) for stage in TRAINED_STAGES}
    training.update({stage: (rules.pretrain, {"method": stages.family_member(stage)[1]})
                     for stage in settings.pretraining_in_chain(config, ds)})
    jobs += [rule_job(rule, "training", stage, "steps", "loss_log", dataset=ds, **chosen)
             for stage, (rule, chosen) in training.items()]
    return jobs

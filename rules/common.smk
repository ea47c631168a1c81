# Shared set-up: config validation, the library on the path, helpers that turn config into rule inputs.
import re
import sys
from pathlib import Path

import yaml
from snakemake.utils import validate

SRC = str(Path(workflow.basedir) / "src")
# first on the path even when already present further back: an installed dpr_pipeline must not shadow this
# checkout's code (workflow_scripts/_library.py does the same for the jobs)
sys.path[:] = [SRC] + [p for p in sys.path if p != SRC]

from dpr_pipeline.config import check_config_values, check_stage_overrides, stage_params, train_split_of
from dpr_pipeline.layout import (RESULTS, benchmark_file, checkpoint_dir, data_file, dataset_file, log_file,
                                 stage_file)
from dpr_pipeline.data.readers import raw_files


SCHEMA = yaml.safe_load(Path(workflow.basedir, "schemas", "config.schema.yaml").read_text())
validate(config, "../schemas/config.schema.yaml")
check_stage_overrides(config, SCHEMA)
check_config_values(config)

# Stages in pipeline order (SimLM Figure 2); each writes results/{dataset}/{stage}/run_{split}.trec. `start` is
# the bi-encoders' starting model (retriever.plm, untrained), the row every trained stage is read against.
STAGES = ["bm25", "start", "retriever1", "retriever2", "reranker", "distill"]
# Pre-training methods (config pretrain.method); the ablation fine-tunes Retriever1 from each (and from `none`,
# the un-pre-trained plm) under results/{dataset}/ablation/{method}/, as SimLM's Table 7 does.
PRETRAIN_METHODS = SCHEMA["$defs"]["pretrain"]["properties"]["method"]["enum"]
ABLATION_STAGES = [f"ablation/{method}" for method in ["none"] + PRETRAIN_METHODS]
# Stages with an encoder, a corpus index and dense runs.
BIENCODERS = ["start", "retriever1", "retriever2", "distill"] + ABLATION_STAGES


wildcard_constraints:
    dataset="|".join(map(re.escape, config["datasets"])),
    split=r"[A-Za-z0-9._-]+",
    stage="|".join(STAGES + ABLATION_STAGES),
    method="|".join(PRETRAIN_METHODS),
    shard=r"\d+",


def dataset_config(wildcards):
    return config["datasets"][wildcards.dataset]


def params_of(stage):
    """A params function: the merged parameters of ``stage`` for the job's dataset."""
    return lambda wildcards: stage_params(config, wildcards.dataset, stage)


def train_split(wildcards):
    """The dataset's train split; an evaluation-only dataset (no train_split) fails with one message naming the
    dataset, the missing split and the job (rule and stage) that needs it."""
    job = " ".join(f"{key}={value}" for key, value in wildcards.items() if key != "dataset")
    return train_split_of(config, wildcards.dataset, f"the training job ({job})" if job else "training")


def eval_splits(wildcards):
    return dataset_config(wildcards)["eval_splits"]


def search_depth(stage, mining_stage):
    """A params function: hits per query of a run. Evaluation splits get the stage's full depth; a train split
    that is only mined for negatives stops at the mining depth (``negatives_depth`` of ``mining_stage``)."""

    def depth(wildcards):
        full = stage_params(config, wildcards.dataset, stage)
        train = dataset_config(wildcards).get("train_split")  # None: evaluation-only
        if wildcards.split == train and wildcards.split not in eval_splits(wildcards):
            return min(full["depth" if stage == "bm25" else "search_depth"],
                       stage_params(config, wildcards.dataset, mining_stage(wildcards))["negatives_depth"])
        return full["depth" if stage == "bm25" else "search_depth"]

    return depth


def leakage_inputs(wildcards):
    """An evaluation split's ingestion also reads the train split's queries, to refuse shared queries (leakage)."""
    train = dataset_config(wildcards).get("train_split")
    if train is None or wildcards.split == train:
        return {}
    return {"train_queries": data_file(f"queries_{train}.parquet", wildcards.dataset)}


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


def biencoder_params(wildcards):
    """Parameters of a bi-encoder stage: the distilled retriever's own, Retriever 1-2's otherwise."""
    return stage_params(config, wildcards.dataset, "distill" if wildcards.stage == "distill" else "retriever")


def retriever_params(wildcards):
    """Corpus encoding, index and search settings, shared by every bi-encoder stage."""
    return stage_params(config, wildcards.dataset, "retriever")


def train_queries(wildcards):
    return data_file(f"queries_{train_split(wildcards)}.parquet", wildcards.dataset)


def train_qrels(wildcards):
    return data_file(f"qrels_{train_split(wildcards)}.parquet", wildcards.dataset)


def encoded_shards(wildcards):
    shards = range(retriever_params(wildcards)["encode_shards"])
    stem = stage_file(wildcards.stage, "embeddings/shard_", wildcards.dataset)
    return {"vectors": [f"{stem}{i}.npy" for i in shards], "ids": [f"{stem}{i}.ids.parquet" for i in shards]}


def teacher_shards(wildcards):
    shards = range(stage_params(config, wildcards.dataset, "reranker")["teacher_shards"])
    return [stage_file("reranker", f"teacher/shard_{i}.parquet", wildcards.dataset) for i in shards]


from dpr_pipeline.cluster import GPU_INFERENCE_RULES, GPU_TRAINING_RULES, job_resources, scaled


def split_files(wildcards):
    """The split's raw file names when the dataset's `split_files` renames them (msmarco), else None."""
    return dataset_config(wildcards).get("split_files", {}).get(wildcards.split)


def threads_of(rule_name):
    """A rule's CPU threads: config `resources` (per dataset overrides), see src/dpr_pipeline/cluster.py."""
    return lambda wildcards: job_resources(config, wildcards.dataset, rule_name)["threads"]


def resources_of(rule_name):
    """A rule's portable resources (docs/cluster.md): mem_mb and runtime (minutes) from config `resources`, times
    the attempt number on a retry; gpu: the stage's `processes` for a trainer (torchrun starts one process per
    GPU), 1 for the other GPU rules, 0 for CPU rules."""
    first = lambda wildcards: job_resources(config, wildcards.dataset, rule_name)
    resources = {
        "mem_mb": lambda wildcards, attempt: scaled(first(wildcards)["mem_mb"], attempt),
        "runtime": lambda wildcards, attempt: scaled(first(wildcards)["runtime"], attempt),
        "gpu": 0,
    }
    if rule_name in GPU_TRAINING_RULES:
        stage = GPU_TRAINING_RULES[rule_name]
        resources["gpu"] = lambda wildcards: stage_params(config, wildcards.dataset, stage)["processes"]
    elif rule_name in GPU_INFERENCE_RULES:
        resources["gpu"] = 1
    return resources


def bm25_negatives_pool(wildcards):
    """Official BM25 negatives when the dataset names a file, else our Pyserini train run."""
    if "official_negatives" in dataset_config(wildcards):
        return data_file("official_negatives.parquet", wildcards.dataset)
    return stage_file("bm25", f"run_{train_split(wildcards)}.trec", wildcards.dataset)


def pretrain_params(wildcards):
    """The pre-training parameters of the job's dataset, with the method named by the {method} wildcard."""
    return {**stage_params(config, wildcards.dataset, "pretrain"), "method": wildcards.method}


def token_shards(wildcards):
    shards = range(stage_params(config, wildcards.dataset, "pretrain")["tokenize_shards"])
    return [stage_file("tokens", f"part_{i}.parquet", wildcards.dataset) for i in shards]


def pretrained_model(dataset, method):
    return stage_file("pretrain", f"{method}/model", dataset)


def initialisation(stage):
    """The model a bi-encoder stage starts from: ``plm`` as configured, where ``plm: pretrain`` means the output
    of ``pretrain.method`` on this dataset; an ablation stage ``ablation/{method}`` starts from that method's
    output (``none``: the plm that pre-training starts from)."""

    def reference(wildcards):
        if wildcards.get("stage", "").startswith("ablation/"):
            method = wildcards.stage.split("/", 1)[1]
            if method == "none":
                return stage_params(config, wildcards.dataset, "pretrain")["plm"]
            return pretrained_model(wildcards.dataset, method)
        plm = stage_params(config, wildcards.dataset, stage)["plm"]
        if plm == "pretrain":
            return pretrained_model(wildcards.dataset, stage_params(config, wildcards.dataset, "pretrain")["method"])
        return plm

    return reference


def initialisation_input(stage):
    """The initialisation as a job input when the workflow builds it (a pre-training output), else nothing."""

    def inputs(wildcards):
        model = initialisation(stage)(wildcards)
        return [model] if model.startswith(f"{RESULTS}/") else []

    return inputs


def trained_params(stage):
    """A stage's parameters with ``plm`` resolved to the initialisation the job starts from."""
    return lambda wildcards: {**stage_params(config, wildcards.dataset, stage), "plm": initialisation(stage)(wildcards)}


def ablation_methods(wildcards):
    return stage_params(config, wildcards.dataset, "pretrain")["ablation_methods"]


# Answer-based relevance (format dpr, `relevance: answers`): a passage is relevant when it contains an answer.
ANSWER_METRICS = ["R@5", "R@20", "R@100"]  # top-k retrieval accuracy, SimLM Table 4 (NQ)


def relevance_of(wildcards):
    """How the evaluated dataset judges a hit (evaluated_dataset: the transfer target in transfer_evaluate)."""
    return evaluated_dataset(wildcards).get("relevance", "qrels")


def dataset_metrics(wildcards):
    """The evaluated dataset's `metrics`, else evaluation.metrics (qrels) or R@5/R@20/R@100 (answers)."""
    if "metrics" in evaluated_dataset(wildcards):
        return evaluated_dataset(wildcards)["metrics"]
    return ANSWER_METRICS if relevance_of(wildcards) == "answers" else config["evaluation"]["metrics"]


def evaluation_inputs(wildcards):
    """A stage's runs per evaluation split of the evaluated dataset (a transfer target's runs live under
    results/{A}/{stage}/transfer/{B}/) and what judges them there: qrels, or answers and the corpus."""
    judged = wildcards.get("target", wildcards.dataset)
    splits = evaluated_dataset(wildcards)["eval_splits"]
    stem = stage_file(wildcards.stage, f"transfer/{judged}/" if "target" in wildcards.keys() else "", wildcards.dataset)
    inputs = {"runs": [f"{stem}run_{s}.trec" for s in splits]}
    if relevance_of(wildcards) == "answers":
        inputs["answers"] = [data_file(f"answers_{s}.parquet", judged) for s in splits]
        inputs["corpus"] = data_file("corpus.parquet", judged)
    else:
        inputs["qrels"] = [data_file(f"qrels_{s}.parquet", judged) for s in splits]
    return inputs


def mining_answer_inputs(wildcards):
    """Answer-based datasets: the train answers and the corpus, so mined negatives contain no answer."""
    if relevance_of(wildcards) != "answers":
        return {}
    return {"answers": data_file(f"answers_{train_split(wildcards)}.parquet", wildcards.dataset),
            "corpus": data_file("corpus.parquet", wildcards.dataset)}


def bm25_negatives_answer_inputs(wildcards):
    """As mining_answer_inputs, for BM25 negatives taken from our Pyserini run (official ones are left as is)."""
    return {} if "official_negatives" in dataset_config(wildcards) else mining_answer_inputs(wildcards)


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


# Zero-shot transfer (rules/transfer.smk): {dataset} = A, the dataset the models trained on; {target} = B.
def evaluated_dataset(wildcards):
    """The dataset whose qrels and evaluation settings score a job's runs: the transfer target B when the job
    has one (transfer_evaluate), else the job's own dataset (evaluate)."""
    return config["datasets"][wildcards.get("target", wildcards.dataset)]


def transfer_retriever_params(wildcards):
    """A's retriever settings (model side: encoding batch size, embedding dtype) with the corpus-side ones of
    the target B: the number of encoding jobs, the index and the search depth."""
    target = stage_params(config, wildcards.target, "retriever")
    return {**retriever_params(wildcards), **{key: target[key] for key in ("encode_shards", "index", "search_depth")}}


def transfer_encoded_shards(wildcards):
    shards = range(transfer_retriever_params(wildcards)["encode_shards"])
    stem = stage_file(wildcards.stage, f"transfer/{wildcards.target}/embeddings/shard_", wildcards.dataset)
    return {"vectors": [f"{stem}{i}.npy" for i in shards], "ids": [f"{stem}{i}.ids.parquet" for i in shards]}


def transfer_leakage_inputs(wildcards):
    """What transfer_leakage compares: B's evaluation queries, and A's train queries when A has a train split."""
    train = dataset_config(wildcards).get("train_split")
    targets = config["datasets"][wildcards.target]["eval_splits"]
    inputs = {"target_queries": [data_file(f"queries_{s}.parquet", wildcards.target) for s in targets]}
    return {**inputs, "train_queries": data_file(f"queries_{train}.parquet", wildcards.dataset)} if train else inputs


TRANSFER_LEAKAGE = dataset_file("transfer_leakage_{target}.json")


def transfer_metrics(wildcards):
    """Per target B, in transfer_to order: B's own BM25 (the baseline column), then each transferred stage."""
    return [
        path
        for target in dataset_config(wildcards)["transfer_to"]
        for path in [stage_file("bm25", "metrics.json", target)]
        + [stage_file(stage, f"transfer/{target}/metrics.json", wildcards.dataset) for stage in config["transfer"]["stages"]]
    ]

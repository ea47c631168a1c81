# Shared set-up: config validation, the library on the path, helpers that turn config into rule inputs.
import re
import sys
from pathlib import Path

import yaml
from snakemake.utils import validate

SRC = str(Path(workflow.basedir) / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

from dpr_pipeline.config import check_config_values, check_stage_overrides, stage_params
from dpr_pipeline.data.readers import raw_files


SCHEMA = yaml.safe_load(Path(workflow.basedir, "schemas", "config.schema.yaml").read_text())
validate(config, "../schemas/config.schema.yaml")
check_stage_overrides(config, SCHEMA)
check_config_values(config)

# Stages in pipeline order (SimLM Figure 2); each writes results/{dataset}/{stage}/run_{split}.trec.
STAGES = ["bm25", "retriever1", "retriever2", "reranker", "distill"]
# Pre-training methods (config pretrain.method); the ablation fine-tunes Retriever1 from each (and from `none`,
# the un-pre-trained plm) under results/{dataset}/ablation/{method}/, as SimLM's Table 7 does.
PRETRAIN_METHODS = SCHEMA["$defs"]["pretrain"]["properties"]["method"]["enum"]
ABLATION_STAGES = [f"ablation/{method}" for method in ["none"] + PRETRAIN_METHODS]
# Stages with an encoder, a corpus index and dense runs.
BIENCODERS = ["retriever1", "retriever2", "distill"] + ABLATION_STAGES


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
    return dataset_config(wildcards)["train_split"]


def eval_splits(wildcards):
    return dataset_config(wildcards)["eval_splits"]


def search_depth(stage, mining_stage):
    """A params function: hits per query of a run. Evaluation splits get the stage's full depth; a train split
    that is only mined for negatives stops at the mining depth (``negatives_depth`` of ``mining_stage``)."""

    def depth(wildcards):
        full = stage_params(config, wildcards.dataset, stage)
        if wildcards.split == train_split(wildcards) and wildcards.split not in eval_splits(wildcards):
            return min(full["depth" if stage == "bm25" else "search_depth"],
                       stage_params(config, wildcards.dataset, mining_stage(wildcards))["negatives_depth"])
        return full["depth" if stage == "bm25" else "search_depth"]

    return depth


def data_file(name):
    return f"results/{{dataset}}/data/{name}"


def final_targets():
    """What `snakemake` with no target builds: every stage's metrics and the summary, per run_datasets entry."""
    targets = []
    for dataset in config["run_datasets"]:
        targets += [f"results/{dataset}/{stage}/metrics.png" for stage in STAGES]
        targets += [f"results/{dataset}/summary.{ext}" for ext in ("json", "md", "png")]
    return targets


def biencoder_params(wildcards):
    """Parameters of a bi-encoder stage: the distilled retriever's own, Retriever 1-2's otherwise."""
    return stage_params(config, wildcards.dataset, "distill" if wildcards.stage == "distill" else "retriever")


def retriever_params(wildcards):
    """Corpus encoding, index and search settings, shared by every bi-encoder stage."""
    return stage_params(config, wildcards.dataset, "retriever")


def train_queries(wildcards):
    return f"results/{wildcards.dataset}/data/queries_{train_split(wildcards)}.parquet"


def train_qrels(wildcards):
    return f"results/{wildcards.dataset}/data/qrels_{train_split(wildcards)}.parquet"


def encoded_shards(wildcards):
    shards = range(retriever_params(wildcards)["encode_shards"])
    stem = f"results/{wildcards.dataset}/{wildcards.stage}/embeddings/shard_"
    return {"vectors": [f"{stem}{i}.npy" for i in shards], "ids": [f"{stem}{i}.ids.parquet" for i in shards]}


def teacher_shards(wildcards):
    shards = range(stage_params(config, wildcards.dataset, "reranker")["teacher_shards"])
    return [f"results/{wildcards.dataset}/reranker/teacher/shard_{i}.parquet" for i in shards]


def checkpoint_dir(stage):
    """Undeclared on purpose: Snakemake keeps it when a job fails, so a rerun resumes from it."""
    return f"results/{{dataset}}/checkpoints/{stage}"


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
        return f"results/{wildcards.dataset}/data/official_negatives.parquet"
    return f"results/{wildcards.dataset}/bm25/run_{train_split(wildcards)}.trec"


def pretrain_params(wildcards):
    """The pre-training parameters of the job's dataset, with the method named by the {method} wildcard."""
    return {**stage_params(config, wildcards.dataset, "pretrain"), "method": wildcards.method}


def token_shards(wildcards):
    shards = range(stage_params(config, wildcards.dataset, "pretrain")["tokenize_shards"])
    return [f"results/{wildcards.dataset}/tokens/part_{i}.parquet" for i in shards]


def pretrained_model(dataset, method):
    return f"results/{dataset}/pretrain/{method}/model"


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
        return [model] if model.startswith("results/") else []

    return inputs


def trained_params(stage):
    """A stage's parameters with ``plm`` resolved to the initialisation the job starts from."""
    return lambda wildcards: {**stage_params(config, wildcards.dataset, stage), "plm": initialisation(stage)(wildcards)}


def ablation_methods(wildcards):
    return stage_params(config, wildcards.dataset, "pretrain")["ablation_methods"]

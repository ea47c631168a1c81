# Shared set-up: config validation, the library on the path, helpers that turn config into rule inputs.
import re
import sys
from pathlib import Path

import yaml
from snakemake.utils import validate

SRC = str(Path(workflow.basedir) / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

from dpr_pipeline.config import check_stage_overrides, stage_params
from dpr_pipeline.data.readers import raw_files


validate(config, "../schemas/config.schema.yaml")
check_stage_overrides(
    config, yaml.safe_load(Path(workflow.basedir, "schemas", "config.schema.yaml").read_text())
)

STAGES = ["bm25"]  # stages whose metrics.json the evaluate rule can make


wildcard_constraints:
    dataset="|".join(map(re.escape, config["datasets"])),
    split=r"[A-Za-z0-9._-]+",
    stage="|".join(STAGES),


def dataset_config(wildcards):
    return config["datasets"][wildcards.dataset]


def params_of(stage):
    """A params function: the merged parameters of ``stage`` for the job's dataset."""
    return lambda wildcards: stage_params(config, wildcards.dataset, stage)


def train_split(wildcards):
    return dataset_config(wildcards)["train_split"]


def eval_splits(wildcards):
    return dataset_config(wildcards)["eval_splits"]


def data_file(name):
    return f"results/{{dataset}}/data/{name}"


def final_targets():
    """What `snakemake` with no target builds: every implemented stage for each dataset in run_datasets."""
    targets = []
    for dataset in config["run_datasets"]:
        targets += [f"results/{dataset}/bm25/negatives.parquet"]
        targets += [f"results/{dataset}/{stage}/metrics.json" for stage in STAGES]
        targets += [f"results/{dataset}/{stage}/metrics.png" for stage in STAGES]
    return targets


def bm25_negatives_pool(wildcards):
    """Official BM25 negatives when the dataset names a file, else our Pyserini train run."""
    if "official_negatives" in dataset_config(wildcards):
        return f"results/{wildcards.dataset}/data/official_negatives.parquet"
    return f"results/{wildcards.dataset}/bm25/run_{train_split(wildcards)}.trec"

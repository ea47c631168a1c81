"""The re-ranker's Eq. 4 loss on groups of the *held-out* dev queries, untrained (chance, ln(1 + n)) and as the
workflow trained it: each dev query's positive with ``negatives_per_query`` negatives drawn from Retriever₂'s dev
top ``mining.retriever2.depth`` (the groups the re-ranker trains on, made from queries it never saw). Run after
the workflow, on the dataset's dev split (``dev_split``):

    .venv/bin/python experiments/reranker_dev_loss.py --dataset scifact
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from dpr_pipeline.data.dev_split import dev_split_of  # noqa: E402
from dpr_pipeline.retrieval.negatives import mine_hard_negatives  # noqa: E402
from dpr_pipeline.training.cross_encoder import listwise_loss_of  # noqa: E402
from dpr_pipeline.orchestration.config import load_config, stage_params  # noqa: E402
from dpr_pipeline.layout import data_file, stage_file  # noqa: E402
from dpr_pipeline.stages import stage  # noqa: E402


def held_out_reranker_loss(config: dict, dataset: str) -> dict:
    dev = dev_split_of(config["datasets"][dataset])
    if dev is None:
        raise SystemExit(f"dataset {dataset!r} has no dev_split: set datasets.{dataset}.dev_split first")
    params = stage_params(config, dataset, "reranker")
    reranked = stage("reranker").fed_by  # the stage whose runs it re-ranks and whose negatives train it
    depth = stage_params(config, dataset, "mining")[reranked]["depth"]
    queries, qrels = REPO / data_file(f"queries_{dev.name}.parquet", dataset), \
        REPO / data_file(f"qrels_{dev.name}.parquet", dataset)
    with tempfile.TemporaryDirectory() as tmp:
        groups = Path(tmp) / "dev_groups.parquet"
        mine_hard_negatives(str(REPO / stage_file(reranked, f"run_{dev.name}.trec", dataset)), str(qrels),
                            str(groups), depth=depth, keep=depth, seed=params["seed"], source=dev.name)
        loss = {name: listwise_loss_of(reference, groups, REPO / data_file("passages.arrow", dataset), queries,
                                       negatives_per_query=params["negatives_per_query"],
                                       max_length=params["max_length"], seed=params["seed"], bf16=params["bf16"])
                for name, reference in (("untrained", params["plm"]),
                                        ("trained", str(REPO / stage_file("reranker", "model", dataset))))}
    return {"split": dev.name, "chance": math.log(1 + params["negatives_per_query"]), "heldout_loss": loss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--configfile", type=Path, default=REPO / "config.yaml")
    args = parser.parse_args()
    print(json.dumps(held_out_reranker_loss(load_config(args.configfile), args.dataset), indent=2))


if __name__ == "__main__":
    main()

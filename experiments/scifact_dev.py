"""Choose the bundled SciFact settings without the test split: a seeded dev split carved from the train queries.

``carve`` writes a BEIR folder whose ``qrels/train.tsv`` keeps 90 % of the train queries and ``qrels/dev.tsv`` the
other 10 % (whole queries, seeded), and a config file holding config.yaml's ``scifact`` entry unchanged except
for that folder and ``eval_splits: [dev]`` (dataset ``scifact_dev``). The workflow then runs every stage on it:

    .venv/bin/python experiments/scifact_dev.py carve --out experiments/runs/scifact_dev
    .venv/bin/snakemake --configfile experiments/runs/scifact_dev/config.yaml   # results/scifact_dev/summary.md

``reranker`` trains the re-ranker exactly as the ``train_reranker`` rule does (``reranker`` settings of the carved
config, on the train part's BM25 negatives, for a quick look that needs no Retriever₂) and reports its Eq. 4 loss
on the *held-out* dev queries' groups before and after training (chance is ln(1 + n)), and nDCG@10 of a dev run
re-ranked:

    .venv/bin/python experiments/scifact_dev.py reranker --out experiments/runs/scifact_dev \\
        --run results/scifact_dev/start/run_dev.trec
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from dpr_pipeline.config import stage_params, validate_config  # noqa: E402

DATASET = "scifact_dev"


def carve(source: Path, out: Path, fraction: float, seed: int) -> Path:
    """The 90/10 BEIR folder and its config (see the module docstring); returns the config path."""
    lines = (source / "qrels" / "train.tsv").read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], [line for line in lines[1:] if line.strip()]
    queries = sorted({row.split("\t")[0] for row in rows})
    dev = set(np.random.default_rng(seed).choice(queries, size=round(len(queries) * fraction), replace=False))
    data = out / "data"
    (data / "qrels").mkdir(parents=True, exist_ok=True)
    for name in ("corpus.jsonl.gz", "queries.jsonl.gz"):
        shutil.copy(source / name, data / name)
    for split, keep in (("train", False), ("dev", True)):
        chosen = [row for row in rows if (row.split("\t")[0] in dev) == keep]
        (data / "qrels" / f"{split}.tsv").write_text("\n".join([header, *chosen]) + "\n", encoding="utf-8")
    config = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    entry = dict(config["datasets"]["scifact"], path=str(data.resolve()), eval_splits=["dev"])
    entry.pop("allow_overlap", None)      # the test split's overlap; the carved splits are checked afresh
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump({"run_datasets": [DATASET], "datasets": {DATASET: entry}}), encoding="utf-8")
    print(f"{len(queries) - len(dev)} train and {len(dev)} dev queries (seed {seed}) in {data}; config {path}")
    return path


def held_out_reranker(out: Path, run: Path, depth: int) -> dict:
    """Train the re-ranker on the train part, score the dev groups' Eq. 4 loss before/after, re-rank ``run``."""
    from dpr_pipeline.cross_encoder_scoring import rerank_run
    from dpr_pipeline.data.schemas import read_artifact
    from dpr_pipeline.metrics import evaluate_run
    from dpr_pipeline.reranker import listwise_loss_of, train_reranker
    from dpr_pipeline.runs import read_trec_run

    config = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    config.update(yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8")))
    params = stage_params(validate_config(config), DATASET, "reranker")
    results, data = REPO / "results" / DATASET, REPO / "results" / DATASET / "data"
    heldout = out / "dev_negatives.parquet"
    _dev_negatives(results / "bm25" / "run_dev.trec", data / "qrels_dev.parquet", heldout,
                   depth=params["negatives_depth"])
    model = out / "reranker"
    shutil.rmtree(model, ignore_errors=True)
    loss = {}
    loss["before"] = listwise_loss_of(params["plm"], heldout, data / "corpus.parquet", data / "queries_dev.parquet",
                                      negatives_per_query=params["negatives_per_query"],
                                      max_length=params["max_length"], bf16=params["bf16"])
    train_reranker(results / "bm25" / "negatives.parquet", data / "corpus.parquet", data / "queries_train.parquet",
                   model, out / "reranker_checkpoints", out / "reranker_loss.jsonl", params)
    loss["after"] = listwise_loss_of(model, heldout, data / "corpus.parquet", data / "queries_dev.parquet",
                                     negatives_per_query=params["negatives_per_query"],
                                     max_length=params["max_length"], bf16=params["bf16"])
    rerank_run(model, run, data / "corpus.parquet", data / "queries_dev.parquet", out / "reranked_dev.trec",
               depth=depth, max_length=params["max_length"], batch_size=params["score_batch_size"], tag="dev",
               bf16=params["bf16"])
    qrels = read_artifact(data / "qrels_dev.parquet", "qrels")
    metrics = ["nDCG@10", "MRR@10", "R@50"]
    return {"chance": math.log(1 + params["negatives_per_query"]), "heldout_loss": loss,
            "run": evaluate_run(read_trec_run(run), qrels, metrics),
            "reranked": evaluate_run(read_trec_run(out / "reranked_dev.trec"), qrels, metrics)}


def _dev_negatives(run_path: Path, qrels_path: Path, output: Path, *, depth: int) -> None:
    """The dev queries' groups: positives from the dev qrels, negatives the top-``depth`` BM25 non-positives."""
    from dpr_pipeline.negatives import mine_hard_negatives

    mine_hard_negatives(str(run_path), str(qrels_path), str(output), depth=depth, count=depth, seed=0,
                        source="bm25")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["carve", "reranker"])
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "runs" / DATASET)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--run", type=Path, help="reranker: the dev run to re-rank")
    parser.add_argument("--depth", type=int, default=30, help="reranker: hits re-ranked per query")
    args = parser.parse_args()
    if args.command == "carve":
        carve(REPO / "data" / "scifact", args.out, args.fraction, args.seed)
    else:
        print(json.dumps(held_out_reranker(args.out, args.run, args.depth), indent=2))


if __name__ == "__main__":
    main()

"""Choose the bundled SciFact settings without the test split: a seeded dev split carved from the train queries.

``carve`` writes a BEIR folder whose ``qrels/train.tsv`` keeps 90 % of the train queries and ``qrels/dev.tsv`` the
other 10 % (whole queries, seeded), and a config file holding config.yaml's ``scifact`` entry unchanged except
for that folder and ``eval_splits: [dev]`` (dataset ``scifact_dev``). The workflow then runs every stage on it:

    .venv/bin/python experiments/scifact_dev.py carve --out experiments/runs/scifact_dev
    .venv/bin/snakemake --configfile experiments/runs/scifact_dev/config.yaml   # results/scifact_dev/summary.md

``reranker-loss`` then reports the re-ranker's Eq. 4 loss on groups of the *held-out* dev queries (each positive
with ``negatives_per_query`` negatives drawn from Retriever₂'s top ``mining.retriever2.depth`` on dev), untrained (chance,
ln(1 + n)) and as the workflow trained it on the train part:

    .venv/bin/python experiments/scifact_dev.py reranker-loss --out experiments/runs/scifact_dev
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from dpr_pipeline.config import stage_params, validate_config  # noqa: E402

DATASET = "scifact_dev"


def carve(source: Path, out: Path, fraction: float, seed: int) -> Path:
    """The 90/10 BEIR folder and its config (see the module docstring); returns the config path."""
    lines = (source / "qrels" / "train.tsv").read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], [line for line in lines[1:] if line.strip()]
    queries = sorted({row.split("\t")[0] for row in rows}, key=lambda q: (not q.isdigit(), int(q) if q.isdigit() else q))
    random.Random(seed).shuffle(queries)
    dev = set(queries[:int(len(queries) * fraction)])
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


def held_out_reranker_loss(out: Path, run: Path, model: Path) -> dict:
    """Eq. 4 on the held-out dev queries' groups (positive + ``negatives_per_query`` of the run's top
    ``mining.retriever2.depth`` non-positives): the untrained ``plm`` (chance, ln(1 + n)) against the trained
    ``model``."""
    from dpr_pipeline.negatives import mine_hard_negatives
    from dpr_pipeline.reranker import listwise_loss_of

    config = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    config.update(yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8")))
    config = validate_config(config)
    params = stage_params(config, DATASET, "reranker")
    depth = stage_params(config, DATASET, "mining")["retriever2"]["depth"]
    data = REPO / "results" / DATASET / "data"
    groups = out / "dev_groups.parquet"
    mine_hard_negatives(str(run), str(data / "qrels_dev.parquet"), str(groups), depth=depth, keep=depth,
                        seed=params["seed"], source="dev")
    loss = {name: listwise_loss_of(reference, groups, data / "corpus.parquet", data / "queries_dev.parquet",
                                   negatives_per_query=params["negatives_per_query"], max_length=params["max_length"],
                                   seed=params["seed"], bf16=params["bf16"])
            for name, reference in (("untrained", params["plm"]), ("trained", str(model)))}
    return {"chance": math.log(1 + params["negatives_per_query"]), "heldout_loss": loss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["carve", "reranker-loss"])
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "runs" / DATASET)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--run", type=Path, default=REPO / "results" / DATASET / "retriever2" / "run_dev.trec",
                        help="reranker-loss: the dev run whose hits make the held-out groups")
    parser.add_argument("--model", type=Path, default=REPO / "results" / DATASET / "reranker" / "model",
                        help="reranker-loss: the trained re-ranker")
    args = parser.parse_args()
    if args.command == "carve":
        carve(REPO / "data" / "scifact", args.out, args.fraction, args.seed)
    else:
        print(json.dumps(held_out_reranker_loss(args.out, args.run, args.model), indent=2))


if __name__ == "__main__":
    main()

"""A user's small collection, made from the bundled SciFact: ``--queries`` of its train claims (a seeded sample),
the whole corpus and the test split, with the bundled `scifact` dataset's stage settings copied as they are (what
the README's "Your own collection" suggests). Writes the BEIR folder and a config file beside it:

    .venv/bin/python experiments/small_collection.py --queries 200 --out data/scifact-small
    .venv/bin/snakemake --configfile data/scifact-small/config.yaml -- results/scifact-small/summary.md

The dev split is carved from the sampled train claims (``--dev-fraction``); the test split is SciFact's own 300
claims. docs/results/small_collection.md records what such a run gives.
"""

from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "data" / "scifact"


def write_small_collection(out: Path, queries: int, seed: int, dev_fraction: float) -> Path:
    """The sampled collection in ``out`` and its config (``out/config.yaml``); returns the config's path."""
    lines = (SOURCE / "qrels" / "train.tsv").read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], lines[1:]
    train_ids = sorted({row.split("\t")[0] for row in rows}, key=int)
    if not 0 < queries <= len(train_ids):
        raise SystemExit(f"--queries must be between 1 and {len(train_ids)} (SciFact's judged train claims)")
    chosen = set(random.Random(seed).sample(train_ids, queries))
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    (out / "qrels" / "train.tsv").write_text(
        "\n".join([header] + [row for row in rows if row.split("\t")[0] in chosen]) + "\n", encoding="utf-8")
    shutil.copyfile(SOURCE / "qrels" / "test.tsv", out / "qrels" / "test.tsv")
    shutil.copyfile(SOURCE / "corpus.jsonl.gz", out / "corpus.jsonl.gz")
    shutil.copyfile(SOURCE / "queries.jsonl.gz", out / "queries.jsonl.gz")
    bundled = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))["datasets"]["scifact"]
    name = out.name
    dataset = {**bundled, "path": str(out), "dev_split": {"fraction": dev_fraction, "seed": seed}}
    config = {"datasets": {name: dataset}, "run_datasets": [name]}
    config_path = out / "config.yaml"
    config_path.write_text(f"# {queries} of SciFact's train claims (seed {seed}), the bundled stage settings: "
                           f"experiments/small_collection.py\n" + yaml.safe_dump(config, sort_keys=False),
                           encoding="utf-8")
    return config_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=200, help="train claims to keep (of SciFact's 809)")
    parser.add_argument("--seed", type=int, default=0, help="the sample's and the dev split's seed")
    parser.add_argument("--dev-fraction", type=float, default=0.2, help="of the kept claims, carved off as dev")
    parser.add_argument("--out", type=Path, default=Path("data/scifact-small"), help="the collection's folder")
    args = parser.parse_args()
    print(write_small_collection(args.out, args.queries, args.seed, args.dev_fraction))


if __name__ == "__main__":
    main()

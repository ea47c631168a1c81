"""How faithfully a dev pool scores a bi-encoder against the whole corpus (dpr_pipeline.training.dev_selection).

For two bi-encoder stages of a finished run (a trained stage and the stage its model started from), each stage's
dev queries are searched in the whole corpus (the stage's stored corpus vectors) and in pools of several kinds:
BM25's top k of each dev query, with or without the start's own dev-run top k, plus the judged passages. Prints
nDCG@10 of both stages and their difference per pool: a pool whose difference has the corpus's sign chooses as the
corpus would.

    .venv/bin/python experiments/dev_pool_fidelity.py --results results/scifact-small --stage retriever1 --start start
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from dpr_pipeline.data.schemas import read_artifact
from dpr_pipeline.data.trec_runs import read_trec_run
from dpr_pipeline.evaluation.metrics import evaluate_run
from dpr_pipeline.retrieval.encode import encode_queries

METRIC = "nDCG@10"


def top_hits(run: pd.DataFrame, query_ids: list[str], depth: int) -> set[str]:
    return set(run[run["query_id"].isin(query_ids)].groupby("query_id").head(depth)["doc_id"])


def stage_vectors(results: Path, stage: str, query_ids: list[str], split: str, query_max_length: int):
    """A stage's corpus vectors (its stored shards) and its dev query vectors."""
    shards = sorted((results / stage / "embeddings").glob("shard_*.npy"))
    doc_ids = [d for shard in shards for d in pd.read_parquet(str(shard)[:-4] + ".ids.parquet")["doc_id"]]
    passages = np.concatenate([np.load(shard).astype(np.float32) for shard in shards])
    ids, queries = encode_queries(str(results / stage / "model"), results / "data" / f"queries_{split}.parquet",
                                  max_length=query_max_length, batch_size=64)
    rows = [ids.index(q) for q in query_ids]
    return doc_ids, passages, queries[rows]


def score(vectors, query_ids: list[str], qrels: pd.DataFrame, pool: set[str] | None) -> float:
    doc_ids, passages, queries = vectors
    columns = [i for i, doc in enumerate(doc_ids) if pool is None or doc in pool]
    scores = queries @ passages[columns].T
    rows = []
    for row, query in enumerate(query_ids):
        for rank, column in enumerate(np.argsort(-scores[row])[:100]):
            rows.append((query, doc_ids[columns[column]], rank + 1, float(scores[row, column])))
    return evaluate_run(pd.DataFrame(rows, columns=["query_id", "doc_id", "rank", "score"]), qrels, [METRIC])[METRIC]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, required=True, help="a dataset's results folder")
    parser.add_argument("--stage", required=True, help="the trained stage")
    parser.add_argument("--start", required=True, help="the stage whose model it started from")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--query-max-length", type=int, default=64)
    parser.add_argument("--depths", type=int, nargs="+", default=[10, 20, 50])
    args = parser.parse_args()
    qrels = read_artifact(args.results / "data" / f"qrels_{args.split}.parquet", "qrels")
    query_ids = sorted(set(qrels.loc[qrels["relevance"] > 0, "query_id"]))
    judged = set(qrels.loc[qrels["relevance"] > 0, "doc_id"])
    bm25 = read_trec_run(args.results / "bm25" / f"run_{args.split}.trec")
    start_run = read_trec_run(args.results / args.start / f"run_{args.split}.trec")
    vectors = {name: stage_vectors(args.results, name, query_ids, args.split, args.query_max_length)
               for name in (args.start, args.stage)}
    pools = {"whole corpus": None}
    for depth in args.depths:
        pools[f"BM25 top {depth}"] = top_hits(bm25, query_ids, depth) | judged
        pools[f"BM25 + start top {depth}"] = top_hits(bm25, query_ids, depth) | top_hits(start_run, query_ids,
                                                                                           depth) | judged
    print(f"| pool | passages | {args.start} | {args.stage} | difference |\n| --- | ---: | ---: | ---: | ---: |")
    for name, pool in pools.items():
        start, trained = (score(vectors[stage], query_ids, qrels, pool) for stage in (args.start, args.stage))
        size = len(vectors[args.start][0]) if pool is None else len(pool)
        print(f"| {name} | {size} | {start:.4f} | {trained:.4f} | {trained - start:+.4f} |", flush=True)


if __name__ == "__main__":
    main()

"""Memory of a training job's data (passages, negatives, queries) per process, against the corpus size.

Every training process of a node builds its ``QueryGroups`` (src/dpr_pipeline/training/groups.py) and draws from
it. This benchmark writes a synthetic MS MARCO-shaped collection per size under ``--cache`` (``--passages``
passages of about 55 words from a Zipfian vocabulary, as benchmarks/bm25_search_memory.py; train queries at MS
MARCO's ratio, 502,939 per 8,841,823 passages, each with one positive and ``--negatives`` negatives; the passage
store), then starts ``--processes`` processes at once, as the ranks of one job, each building the groups and
drawing one epoch. Each reports its peak RSS (``VmHWM``, which counts the mapped store's pages it touched), its
private memory (USS: what it alone holds, read while all ranks are alive; the store's pages are shared with the
other ranks through the page cache) and its seconds.

    python benchmarks/training_groups_memory.py --cache /tmp/groups_bench --passages 17684 176846 \
        --output benchmarks/runs/training_groups_memory.json

``--src`` runs the processes on another checkout's ``src`` (the code before a change: it read the corpus into a
dict per process, ``read_texts``), so before and after are measured side by side on the same files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# beside this script: Python puts a script's folder first on its path
from bm25_search_memory import PASSAGE_WORDS, QUERY_WORDS, _texts, _zipf

QUERIES_PER_PASSAGE = 502_939 / 8_841_823   # MS MARCO's train queries per passage


def build(folder: Path, passages: int, negatives: int, seed: int) -> None:
    """Corpus, train queries, negatives and passage store artifacts of one size under ``folder``, if absent."""
    import numpy as np
    import pandas as pd

    from dpr_pipeline.data.passage_store import write_passage_store
    from dpr_pipeline.data.schemas import write_artifact

    if (folder / "passages.arrow").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng, vocabulary, probabilities = _zipf(seed)
    texts = []
    for start in range(0, passages, 100_000):
        texts += _texts(rng, vocabulary, probabilities, min(100_000, passages - start), PASSAGE_WORDS, 5)
    write_artifact(pd.DataFrame({"doc_id": [str(i) for i in range(passages)], "title": "", "text": texts}),
                   folder / "corpus.parquet", "corpus")
    queries = max(1, round(passages * QUERIES_PER_PASSAGE))
    write_artifact(pd.DataFrame({"query_id": [f"q{i}" for i in range(queries)],
                                 "text": _texts(rng, vocabulary, probabilities, queries, QUERY_WORDS, 2)}),
                   folder / "queries.parquet", "queries")
    picks = rng.integers(passages, size=(queries, 1 + negatives))
    write_artifact(pd.DataFrame({"query_id": [f"q{i}" for i in range(queries)],
                                 "positive_ids": [[str(row[0])] for row in picks],
                                 "positive_scores": [[np.nan]] * queries,
                                 "negative_ids": [[str(d) for d in row[1:]] for row in picks],
                                 "negative_scores": [[np.nan] * negatives] * queries}),
                   folder / "negatives.parquet", "negatives")
    write_passage_store(folder / "corpus.parquet", folder / "passages.arrow")


def _barrier(folder: Path, name: str, ranks: int) -> None:
    """Wait until ``ranks`` processes have arrived at ``name`` (files in ``folder``)."""
    (folder / f"{name}.{os.getpid()}").touch()
    while len(list(folder.glob(f"{name}.*"))) < ranks:
        time.sleep(0.05)


def _child(folder: Path, negatives_per_query: int, barrier: Path, ranks: int) -> None:
    """Build the groups as the training jobs do, draw one epoch, print peak RSS, USS (MB) and seconds. USS is
    read while every rank is still alive (a barrier before and after): a mapped page that another live rank
    also maps is shared, not private."""
    import psutil
    import torch  # noqa: F401  (every training process has it: the same base before and after)

    from dpr_pipeline.training import groups as module

    started = time.perf_counter()
    if hasattr(module, "read_query_groups"):
        groups = module.read_query_groups(folder / "negatives.parquet", folder / "passages.arrow",
                                          folder / "queries.parquet", negatives_per_query, 42)
    else:  # the code before the passage store: the corpus read into a dict, the negatives into a DataFrame
        from dpr_pipeline.data.schemas import read_artifact
        groups = module.QueryGroups(read_artifact(folder / "negatives.parquet", "negatives"),
                                    *module.read_texts(folder / "corpus.parquet", folder / "queries.parquet"),
                                    negatives_per_query, 42)
    characters = sum(len(p) for i in range(len(groups)) for p in groups.example(i, 0).passages)
    seconds = time.perf_counter() - started
    _barrier(barrier, "drawn", ranks)
    status = Path("/proc/self/status").read_text()
    peak_kb = int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])
    uss = psutil.Process().memory_full_info().uss
    _barrier(barrier, "measured", ranks)
    print(json.dumps({"peak_rss_mb": round(peak_kb / 1024), "uss_mb": round(uss / 2**20),
                      "seconds": round(seconds, 1), "characters": characters}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", required=True, help="folder for the synthetic collections")
    parser.add_argument("--passages", type=int, nargs="+", default=[17_684, 176_846])
    parser.add_argument("--negatives", type=int, default=30, help="negatives per train query in the artifact")
    parser.add_argument("--negatives-per-query", type=int, default=15, help="drawn per group (Table 13: 15)")
    parser.add_argument("--processes", type=int, default=2, help="ranks started at once")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--src", help="the `src` folder the ranks import dpr_pipeline from "
                                      "(default: the installed package)")
    parser.add_argument("--label", default="", help="a name for this series in the outputs")
    parser.add_argument("--output", help="write the table as JSON here (and as markdown next to it, .md)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--barrier", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return _child(Path(args.child), args.negatives_per_query, Path(args.barrier), args.processes)

    src = {"PYTHONPATH": str(Path(args.src).resolve())} if args.src else {}
    env = {**os.environ, **src, "OMP_NUM_THREADS": "1"}
    rows = []
    for passages in args.passages:
        folder = Path(args.cache) / str(passages)
        build(folder, passages, args.negatives, args.seed)
        barrier = Path(tempfile.mkdtemp(prefix="barrier-", dir=folder))
        ranks = [subprocess.Popen([sys.executable, __file__, "--cache", args.cache, "--child", str(folder),
                                   "--negatives-per-query", str(args.negatives_per_query), "--barrier", str(barrier),
                                   "--processes", str(args.processes)],
                                  env=env, stdout=subprocess.PIPE, text=True) for _ in range(args.processes)]
        results = [json.loads(rank.communicate()[0]) for rank in ranks]
        shutil.rmtree(barrier)
        row = {"label": args.label, "passages": passages, "processes": args.processes,
               "store_mb": round((folder / "passages.arrow").stat().st_size / 2**20),
               **{key: max(r[key] for r in results) for key in ("peak_rss_mb", "uss_mb", "seconds")}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(rows, indent=1) + "\n")
        header = "| series | passages | ranks | store file (MB) | peak RSS per rank (MB) | private (USS) per rank (MB) | s |"
        lines = [header, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {r['label']} | {r['passages']:,} | {r['processes']} | {r['store_mb']} | {r['peak_rss_mb']} | "
                  f"{r['uss_mb']} | {r['seconds']} |" for r in rows]
        Path(args.output).with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

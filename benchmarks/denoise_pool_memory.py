"""Memory of a denoising scores job's read of its slice of the pool, against the pool's size.

Writes a synthetic pool per size (``--queries`` train queries, each with one positive and ``--candidates`` candidate
ids of MS MARCO's form, as ``negatives.write_denoise_pool`` writes it: row groups of ``NEGATIVES_ROW_GROUP`` queries),
then, in a fresh process each, reads shard 0 of ``--shards`` as the scoring job does
(``read_negatives_table(pool, rows)`` and its DataFrame) and, for comparison, the whole pool as one table. Reported
per size: the file's size and each read's peak RSS above the process's RSS before it (``VmHWM`` after resetting
it through ``/proc/self/clear_refs``, once the imports are done; Linux).

    python benchmarks/denoise_pool_memory.py --queries 8000 32000 --output benchmarks/runs/denoise_pool_memory.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd


def write_pool(path: Path, queries: int, candidates: int) -> None:
    from dpr_pipeline.data.schemas import write_artifact

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 8_841_823, size=(queries, candidates)).astype(str)
    frame = pd.DataFrame({"query_id": [str(1_000_000 + q) for q in range(queries)],
                          "positive_ids": [[str(q)] for q in range(queries)],
                          "positive_scores": [[1.0]] * queries,
                          "negative_ids": [list(row) for row in ids],
                          "negative_scores": [list(row) for row in rng.random((queries, candidates))]})
    write_artifact(frame, path, "negatives")


def measure(pool: str, what: str, shards: int) -> None:
    """In this process: peak RSS (MB) of reading ``what`` (``shard``: shard 0, ``whole``: the pool) of ``pool``."""
    from dpr_pipeline.data.schemas import open_parquet, read_negatives_table
    from dpr_pipeline.reranking.teacher_scores import shard_slice

    Path("/proc/self/clear_refs").write_text("5")              # the peak RSS starts again from the RSS now
    before = _status_kb("VmRSS")
    if what == "shard":
        rows = shard_slice(open_parquet(pool, "pool").metadata.num_rows, 0, shards)
        count = len(read_negatives_table(pool, rows).to_pandas())
    else:
        count = read_negatives_table(pool).num_rows
    print(json.dumps({"rows": count, "peak_mb": (_status_kb("VmHWM") - before) / 1024}))


def _status_kb(key: str) -> int:
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(key + ":"))
    return int(line.split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, nargs="+", default=[8000, 32000])
    parser.add_argument("--candidates", type=int, default=200, help="candidates per query (MS MARCO: ~200)")
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)  # internal: POOL WHAT SHARDS in this process
    args = parser.parse_args()
    if args.measure:
        measure(args.measure[0], args.measure[1], int(args.measure[2]))
        return
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for queries in args.queries:
            pool = Path(folder, f"pool_{queries}.parquet")
            write_pool(pool, queries, args.candidates)
            row = {"queries": queries, "candidates": args.candidates, "file_mb": pool.stat().st_size / 2**20}
            for what in ("shard", "whole"):
                done = subprocess.run([sys.executable, __file__, "--measure", str(pool), what, str(args.shards)],
                                      capture_output=True, text=True, check=True)
                result = json.loads(done.stdout.strip().splitlines()[-1])
                row[f"{what}_rows"], row[f"{what}_peak_mb"] = result["rows"], result["peak_mb"]
            rows.append(row)
            print(f"{queries:>8} queries x {args.candidates}: file {row['file_mb']:.0f} MB; shard 0 of "
                  f"{args.shards} ({row['shard_rows']} rows) {row['shard_peak_mb']:.0f} MB; whole pool "
                  f"{row['whole_peak_mb']:.0f} MB", flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"shards": args.shards, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

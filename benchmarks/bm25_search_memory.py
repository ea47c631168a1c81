"""Peak memory of the BM25 search job against the number of queries, on a synthetic MS MARCO-shaped corpus.

The corpus (``--passages`` passages of about 55 words drawn from a Zipfian vocabulary of 100k words, no titles,
fixed seed) is written as the pipeline's corpus artifact and indexed with ``bm25.build_index``, once, under the
cache folder. Each query count is then searched by ``bm25.search`` (depth ``--depth``) in a fresh subprocess,
which reports its own peak RSS (``VmHWM``: Pyserini's JVM runs inside the Python process, so this is Python and
Java together). The table is printed and written as JSON and markdown.

    python benchmarks/bm25_search_memory.py --cache /tmp/bm25_bench --queries 50 500 2000 \
        --output benchmarks/runs/bm25_search_memory.json

``--src`` points the subprocesses at another checkout's ``src`` (e.g. the code before a change), and
``--java-heap`` passes the search's ``java_heap`` setting (``none``: leave the JVM's default).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

VOCABULARY = 100_000
PASSAGE_WORDS = 55
QUERY_WORDS = 6


def _words(n: int) -> list[str]:
    """``n`` distinct lower-case words (consonant-vowel syllables, no English stopword among them)."""
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    syllables = [c + v for c in consonants for v in vowels]  # 70
    words = []
    for i in range(n):
        parts, j = [], i
        while True:
            parts.append(syllables[j % len(syllables)])
            j //= len(syllables)
            if j == 0:
                break
        words.append("x" + "".join(parts))  # the leading consonant cluster keeps every word out of the stoplist
    return words


def _texts(rng, vocabulary: list[str], probabilities, count: int, mean_words: int, min_words: int) -> list[str]:
    import numpy as np

    lengths = np.maximum(rng.poisson(mean_words, size=count), min_words)
    tokens = rng.choice(len(vocabulary), size=int(lengths.sum()), p=probabilities)
    words = np.asarray(vocabulary, dtype=object)[tokens]
    ends = np.cumsum(lengths)
    return [" ".join(words[end - length:end]) for end, length in zip(ends, lengths)]


def _zipf(seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    ranks = np.arange(1, VOCABULARY + 1, dtype=np.float64)
    probabilities = 1.0 / ranks
    return rng, _words(VOCABULARY), probabilities / probabilities.sum()


def build(cache: Path, passages: int, max_queries: int, seed: int, threads: int) -> None:
    """Write ``corpus.parquet``, ``queries.parquet`` (``max_queries`` rows) and ``index/`` under ``cache`` if absent."""
    import pandas as pd

    from dpr_pipeline.data.schemas import read_artifact, write_artifact
    from dpr_pipeline.retrieval.bm25 import build_index

    cache.mkdir(parents=True, exist_ok=True)
    corpus, queries, index = cache / "corpus.parquet", cache / "queries.parquet", cache / "index"
    rng, vocabulary, probabilities = _zipf(seed)
    if not corpus.exists():
        started = time.perf_counter()
        ids, texts = [], []
        for start in range(0, passages, 100_000):  # in chunks: the token array of 55M words is large
            count = min(100_000, passages - start)
            texts += _texts(rng, vocabulary, probabilities, count, PASSAGE_WORDS, 5)
            ids += [str(i) for i in range(start, start + count)]
        write_artifact(pd.DataFrame({"doc_id": ids, "title": "", "text": texts}), corpus, "corpus")
        print(f"corpus: {passages} passages in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if not queries.exists() or len(read_artifact(queries, "queries")) < max_queries:
        query_rng = __import__("numpy").random.default_rng(seed + 1)
        texts = _texts(query_rng, vocabulary, probabilities, max_queries, QUERY_WORDS, 2)
        write_artifact(pd.DataFrame({"query_id": [f"q{i}" for i in range(max_queries)], "text": texts}),
                       queries, "queries")
    if not index.exists():
        started = time.perf_counter()
        build_index(corpus, index, threads=threads)
        print(f"index: {time.perf_counter() - started:.0f} s", file=sys.stderr)


def _child(args) -> None:
    """Search the first ``args.child`` queries, then print peak RSS (MB) and seconds as JSON on stdout."""
    from dpr_pipeline.data.schemas import read_artifact, write_artifact
    from dpr_pipeline.retrieval.bm25 import search

    cache = Path(args.cache)
    subset = cache / f"queries-{args.child}.parquet"
    if not subset.exists():
        write_artifact(read_artifact(cache / "queries.parquet", "queries").head(args.child), subset, "queries")
    extra = {} if args.java_heap is None else {"java_heap": None if args.java_heap == "none" else args.java_heap}
    started = time.perf_counter()
    search(cache / "index", subset, Path(args.run_dir) / f"run-{args.child}.trec", depth=args.depth,
           threads=args.threads, **extra)
    seconds = time.perf_counter() - started
    status = Path("/proc/self/status").read_text()
    peak_kb = int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])
    print(json.dumps({"queries": args.child, "peak_rss_mb": round(peak_kb / 1024), "seconds": round(seconds, 1)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", required=True, help="folder for the synthetic corpus, queries and index")
    parser.add_argument("--passages", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, nargs="+", default=[50, 500, 2000])
    parser.add_argument("--depth", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1, help="search (and indexing) threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--src", help="the `src` folder the searches import dpr_pipeline from "
                                      "(default: the installed package)")
    parser.add_argument("--java-heap", help="bm25.java_heap for the searches, or `none` (default: search's default)")
    parser.add_argument("--label", default="", help="a name for this series in the outputs")
    parser.add_argument("--output", help="write the table as JSON here (and as markdown next to it, .md)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return _child(args)

    src = Path(args.src).resolve() if args.src else None
    cache = Path(args.cache)
    build(cache, args.passages, max(args.queries), args.seed, args.threads)
    run_dir = cache / "runs" / (args.label or "default")
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for count in args.queries:
        command = [sys.executable, __file__, "--cache", str(cache), "--child", str(count), "--depth",
                   str(args.depth), "--threads", str(args.threads), "--run-dir", str(run_dir)]
        if args.java_heap is not None:
            command += ["--java-heap", args.java_heap]
        env = {**os.environ, **({"PYTHONPATH": str(src)} if src else {})}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"search of {count} queries failed:\n{done.stderr[-3000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"{rows[-1]['queries']:>8} queries  {rows[-1]['peak_rss_mb']:>7} MB  {rows[-1]['seconds']:>7} s",
              flush=True)
    lines = ["| queries | peak RSS (MB) | seconds |", "| ---: | ---: | ---: |"]
    lines += [f"| {r['queries']:,} | {r['peak_rss_mb']:,} | {r['seconds']} |" for r in rows]
    print("\n".join(lines))
    if args.output:
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        result = {"label": args.label, "passages": args.passages, "depth": args.depth, "threads": args.threads,
                  "java_heap": args.java_heap, "src": str(src) if src else None, "rows": rows}
        output.write_text(json.dumps(result, indent=2) + "\n")
        output.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""Exact dense search's rate on the GPU (PyTorch, :mod:`dpr_pipeline.retrieval.torch_flat_search`) against
faiss-cpu's ``IndexFlatIP``, and whether both return the same hits, at corpus sizes up to MS MARCO's 8.8M passages.

Each size: random unit vectors of ``--dim`` (drawn on ``--device``, added to a faiss ``IndexFlatIP`` in float32),
``--queries`` queries that are noisy copies of corpus rows (so each has clear top hits above a random tail). Timed:
the GPU copy of the index, the torch search of every query (raw ``search`` and the job's ranked hits, ties
resolved and ordered by doc id), and faiss-cpu on the first ``--check-queries`` queries with all cores; then the
hits of those queries compared (identical lists, differing ranks, largest score difference). The MS MARCO line
converts the rates into the train split's search (502,939 queries at ``--depth``).

    python benchmarks/dense_search_throughput.py --device cuda --passages 1000000 8841823 --queries 10000 \
        --depth 1000 --output benchmarks/runs/dense_search_gpu.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import faiss
import numpy as np
import torch
from timing import timed

from dpr_pipeline.retrieval.dense_search import ranked_hits
from dpr_pipeline.retrieval.torch_flat_search import TorchFlatIndex

MSMARCO_TRAIN_QUERIES = 502_939
ADD_ROWS = 1_000_000


def random_index(passages: int, dim: int, device: torch.device, generator: torch.Generator) -> faiss.IndexFlatIP:
    index = faiss.IndexFlatIP(dim)
    for start in range(0, passages, ADD_ROWS):
        rows = torch.randn(min(ADD_ROWS, passages - start), dim, device=device, generator=generator)
        index.add(torch.nn.functional.normalize(rows, dim=1).cpu().numpy())
    return index


def noisy_queries(index: faiss.IndexFlatIP, queries: int, noise: float, rng: np.random.Generator) -> np.ndarray:
    rows = rng.integers(0, index.ntotal, queries)
    vectors = np.stack([index.reconstruct(int(row)) for row in rows])
    vectors += noise * rng.standard_normal(vectors.shape).astype(np.float32) / np.sqrt(index.d)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def compare(expected: list, found: list) -> dict:
    """How far ``found`` (torch) is from ``expected`` (faiss-cpu): hit lists with the same documents in the same
    order, ranks holding another document, documents in one list only, the largest score difference at a rank."""
    pairs = [(dict(a), dict(b), a, b) for (_, a), (_, b) in zip(expected, found)]
    return {"queries": len(expected),
            "identical_doc_lists": sum([d for d, _ in a] == [d for d, _ in b] for _, _, a, b in pairs),
            "differing_ranks": sum(x[0] != y[0] for _, _, a, b in pairs for x, y in zip(a, b)),
            "docs_in_one_list_only": sum(len(a.keys() ^ b.keys()) for a, b, _, _ in pairs),
            "max_score_difference": max((abs(x[1] - y[1]) for _, _, a, b in pairs for x, y in zip(a, b)), default=0.0)}


def measure(passages: int, args: argparse.Namespace, device: torch.device) -> dict:
    generator = torch.Generator(device=device).manual_seed(passages)
    rng = np.random.default_rng(passages)
    began = time.perf_counter()
    index = random_index(passages, args.dim, device, generator)
    queries = noisy_queries(index, args.queries, args.noise, rng)
    doc_ids = np.asarray([f"d{row}" for row in range(passages)], dtype=object)
    query_ids = [f"q{row}" for row in range(args.queries)]
    built = time.perf_counter() - began

    began = time.perf_counter()
    on_device = TorchFlatIndex(index, device)
    copied = time.perf_counter() - began
    on_device.search(queries[:args.batch_size], args.depth + 1)              # warm-up
    raw = timed(lambda: [on_device.search(queries[start:start + args.batch_size], args.depth + 1)
                         for start in range(0, args.queries, args.batch_size)], device)
    began = time.perf_counter()
    torch_hits = list(ranked_hits(on_device, doc_ids, query_ids, queries, depth=args.depth,
                                  batch_size=args.batch_size))
    ranked = time.perf_counter() - began
    del on_device
    if device.type == "cuda":
        torch.cuda.empty_cache()

    check = queries[:args.check_queries]
    began = time.perf_counter()
    faiss_hits = list(ranked_hits(index, doc_ids, query_ids[:args.check_queries], check, depth=args.depth,
                                  batch_size=args.batch_size))
    cpu = time.perf_counter() - began
    result = {"passages": passages, "dim": args.dim, "depth": args.depth, "queries": args.queries,
              "setup_s": round(built, 1), "copy_to_device_s": round(copied, 2),
              "torch_search_qps": round(args.queries / raw), "torch_ranked_qps": round(args.queries / ranked),
              "faiss_cpu_threads": faiss.omp_get_max_threads(), "faiss_cpu_ranked_qps": round(len(check) / cpu, 1),
              "agreement": compare(faiss_hits, torch_hits[:args.check_queries])}
    result["msmarco_train_hours"] = {"torch": round(MSMARCO_TRAIN_QUERIES / result["torch_ranked_qps"] / 3600, 2),
                                     "faiss_cpu": round(MSMARCO_TRAIN_QUERIES / result["faiss_cpu_ranked_qps"] / 3600,
                                                        2)}
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--passages", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--check-queries", type=int, default=500, help="also searched by faiss-cpu and compared")
    parser.add_argument("--depth", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=1024, help="queries per search (dense_search's default)")
    parser.add_argument("--noise", type=float, default=1.0, help="query = corpus row + noise (norm ~ this)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    results = {"device": name, "torch": torch.__version__, "faiss": faiss.__version__,
               "sizes": [measure(passages, args, device) for passages in args.passages]}
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

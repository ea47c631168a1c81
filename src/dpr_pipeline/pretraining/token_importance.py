"""CDMAE's token-importance-aware decoder masking (CDMAE paper, §3.2 "Token Importance Aware Masking").

* :class:`NgramCounts` / :func:`count_ngrams` — corpus statistics for n = 1 … ``max_n``: how often each
  n-gram of content token ids occurs, and how many n-grams of each length the corpus has.
* :func:`pmi` — Eq. 7, PMI(w₁, w₂) = log p(w₁w₂) / (p(w₁) p(w₂)), generalised to n-grams as
  log p(w₁…wₙ) − Σᵢ log p(wᵢ); p(an n-gram) = its count / the number of n-grams of that length in the corpus.
* :func:`ami_importance` — Eq. 8, the average mutual information of each token over the n-grams
  (2 ≤ n ≤ L, window L = 4) that end at it and those that start at it; each side is averaged over the
  n-grams that stay inside the content span (see the function for this boundary convention).
* :func:`importance_aware_mask` — Algorithm 1: perturb each token's importance with N(0, σ) noise
  (footnote 3: σ = 1) and mask the top ⌊n·p⌋ tokens.

n-grams never cross a passage boundary, a special token or padding: only content tokens count.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.models import loading as models
from dpr_pipeline.pretraining.tokens import read_token_shards

MAX_KEY_BITS = 63  # an n-gram key is a non-negative int64


def bits_per_token(vocab_size: int, max_n: int) -> int:
    """⌈log₂ vocab_size⌉: the bits one token takes in an n-gram key; raise if a ``max_n``-gram overflows int64."""
    if vocab_size < 1 or max_n < 1:
        raise ValueError(f"vocab_size ({vocab_size}) and max_n ({max_n}) must be positive")
    bits = (vocab_size - 1).bit_length()
    if bits * max_n > MAX_KEY_BITS:
        raise ValueError(f"vocab_size {vocab_size} needs {bits} bits per token, so a max_n={max_n}-gram "
                         f"needs {bits * max_n} > {MAX_KEY_BITS} bits: lower max_n")
    return bits


def _checked_token_ids(ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """``ids`` as int64; raise unless every id lies in [0, vocab_size)."""
    ids = np.asarray(ids).astype(np.int64, copy=False)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got {ids.min()} … {ids.max()}")
    return ids


@dataclass(frozen=True, eq=False)
class NgramCounts:
    """How often each n-gram (n = 1 … ``max_n``) of content token ids occurs in a corpus.

    An n-gram is an int64 key: its token ids packed ``bits`` bits each, the first token in the highest bits
    (:meth:`pack`). ``keys[n - 1]`` holds the sorted distinct n-grams kept, ``counts[n - 1]`` their counts and
    ``totals[n - 1]`` the number of n-grams of length n in the whole corpus (pruned ones included).

    Pruning (``min_count``) drops n-grams (n ≥ 2) seen fewer than ``min_count`` times; unigrams are always
    kept. Any n-gram absent from the table is looked up as count 1: we only look up n-grams of corpus
    passages, which occur at least once, so pruned n-grams get a lower bound of their count (exact for
    ``min_count = 2``) and every n-gram the counts kept is exact. This bounds memory on an 8.8M-passage corpus,
    where most 3- and 4-grams occur once.
    """

    vocab_size: int
    max_n: int
    min_count: int
    keys: tuple[np.ndarray, ...]
    counts: tuple[np.ndarray, ...]
    totals: np.ndarray

    def __post_init__(self) -> None:
        bits_per_token(self.vocab_size, self.max_n)
        if not len(self.keys) == len(self.counts) == len(self.totals) == self.max_n:
            raise ValueError(f"need keys, counts and totals for each n = 1 … {self.max_n}")

    @property
    def bits(self) -> int:
        return bits_per_token(self.vocab_size, self.max_n)

    def pack(self, ngrams: np.ndarray) -> np.ndarray:
        """The int64 keys of ``ngrams`` [..., n] (token ids in the last axis) → [...]."""
        ids = _checked_token_ids(ngrams, self.vocab_size)
        keys = ids[..., 0]
        for position in range(1, ids.shape[-1]):
            keys = (keys << self.bits) | ids[..., position]
        return keys

    def count(self, n: int, keys: np.ndarray) -> np.ndarray:
        """The corpus counts of the n-grams ``keys`` (any shape); an n-gram not in the table counts 1."""
        table, table_counts = self.keys[n - 1], self.counts[n - 1]
        keys = np.asarray(keys, dtype=np.int64)
        if table.size == 0:
            return np.ones(keys.shape, dtype=np.int64)
        index = np.minimum(np.searchsorted(table, keys), table.size - 1)
        return np.where(table[index] == keys, table_counts[index], 1)

    def pruned(self, min_count: int) -> NgramCounts:
        """Drop n-grams (n ≥ 2) seen fewer than ``min_count`` times; totals are unchanged."""
        kept = [np.ones(self.keys[0].size, dtype=bool)] + [c >= min_count for c in self.counts[1:]]
        return NgramCounts(self.vocab_size, self.max_n, max(min_count, self.min_count),
                           tuple(k[m] for k, m in zip(self.keys, kept)),
                           tuple(c[m] for c, m in zip(self.counts, kept)), self.totals.copy())

    @classmethod
    def merge(cls, shards: list[NgramCounts]) -> NgramCounts:
        """Sum the counts of corpus shards counted separately (e.g. in parallel).

        Exact for shards counted with ``min_count=1``: count each shard unpruned, merge, then call
        :meth:`pruned`. Merging pruned shards is approximate: an n-gram pruned in one shard loses that
        shard's occurrences.
        """
        if not shards:
            raise ValueError("nothing to merge")
        first = shards[0]
        if any((s.vocab_size, s.max_n) != (first.vocab_size, first.max_n) for s in shards):
            raise ValueError("can only merge counts with the same vocab_size and max_n")
        tables = [_sum_tables([(s.keys[n], s.counts[n]) for s in shards]) for n in range(first.max_n)]
        return cls(first.vocab_size, first.max_n, max(s.min_count for s in shards),
                   tuple(k for k, _ in tables), tuple(c for _, c in tables),
                   np.sum([s.totals for s in shards], axis=0).astype(np.int64))

    def save(self, path: str | Path) -> None:
        """Write an .npz file (atomically)."""
        arrays = {f"keys_{n + 1}": k for n, k in enumerate(self.keys)}
        arrays |= {f"counts_{n + 1}": c for n, c in enumerate(self.counts)}
        with atomic_output(path) as tmp, open(tmp, "wb") as out:
            np.savez(out, vocab_size=self.vocab_size, max_n=self.max_n, min_count=self.min_count,
                     totals=self.totals, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> NgramCounts:
        with np.load(path, allow_pickle=False) as data:
            max_n = int(data["max_n"])
            return cls(int(data["vocab_size"]), max_n, int(data["min_count"]),
                       tuple(data[f"keys_{n}"] for n in range(1, max_n + 1)),
                       tuple(data[f"counts_{n}"] for n in range(1, max_n + 1)), data["totals"])


def _sum_tables(tables: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """One sorted table of distinct keys from several (keys, counts) tables, summing the counts of equal keys."""
    keys = np.concatenate([k for k, _ in tables]).astype(np.int64, copy=False)
    counts = np.concatenate([c for _, c in tables]).astype(np.int64, copy=False)
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    starts = np.flatnonzero(np.diff(keys, prepend=keys[:1] - 1))
    return keys[starts], (np.add.reduceat(counts, starts) if starts.size else counts)


class _TableAccumulator:
    """Sums per-chunk (keys, counts) tables; merging like a binary counter re-sorts each key O(log chunks) times."""

    def __init__(self) -> None:
        self.tables: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, table: tuple[np.ndarray, np.ndarray]) -> None:
        self.tables.append(table)
        while len(self.tables) > 1 and self.tables[-1][0].size >= self.tables[-2][0].size:
            newest, previous = self.tables.pop(), self.tables.pop()
            self.tables.append(_sum_tables([previous, newest]))

    def total(self) -> tuple[np.ndarray, np.ndarray]:
        return _sum_tables(self.tables or [(np.empty(0, np.int64), np.empty(0, np.int64))])


def _chunk_tables(chunk: list[np.ndarray], vocab_size: int, max_n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (distinct keys, counts) of each n-gram length in a chunk of sequences, n-grams within one sequence."""
    tokens = _checked_token_ids(np.concatenate(chunk), vocab_size)
    lengths = np.array([len(sequence) for sequence in chunk])
    room = np.repeat(np.cumsum(lengths), lengths) - np.arange(tokens.size)  # tokens from here to the sequence end
    bits = bits_per_token(vocab_size, max_n)
    keys, tables = tokens, []
    for n in range(1, max_n + 1):
        if n > 1:
            keys = (keys[:-1] << bits) | tokens[n - 1:]  # keys[s]: the n-gram starting at token s
        tables.append(np.unique(keys[room[:keys.size] >= n], return_counts=True))
    return tables


def _chunks(sequences: Iterable[np.ndarray], chunk_tokens: int) -> Iterator[list[np.ndarray]]:
    """Consecutive groups of sequences of at least ``chunk_tokens`` tokens each (the last may hold fewer)."""
    chunk: list[np.ndarray] = []
    size = 0
    for sequence in sequences:
        chunk.append(np.asarray(sequence))
        size += len(sequence)
        if size >= chunk_tokens:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def count_ngrams(sequences: Iterable[np.ndarray], vocab_size: int, max_n: int = 4, min_count: int = 2,
                 chunk_tokens: int = 1 << 22) -> NgramCounts:
    """Count the n-grams (n = 1 … ``max_n``) of ``sequences``: 1-D arrays of content token ids, no special tokens.

    Sequences are read in chunks of about ``chunk_tokens`` tokens, each counted with numpy at once.
    """
    bits_per_token(vocab_size, max_n)
    accumulators = [_TableAccumulator() for _ in range(max_n)]
    totals = np.zeros(max_n, dtype=np.int64)
    for chunk in _chunks(sequences, chunk_tokens):
        for n, (keys, chunk_counts) in enumerate(_chunk_tables(chunk, vocab_size, max_n)):
            accumulators[n].add((keys, chunk_counts.astype(np.int64)))
            totals[n] += chunk_counts.sum()
    tables = [accumulator.total() for accumulator in accumulators]
    counts = NgramCounts(vocab_size, max_n, 1, tuple(k for k, _ in tables), tuple(c for _, c in tables), totals)
    return counts.pruned(min_count) if min_count > 1 else counts


def write_corpus_ngram_counts(token_shards: list[str], tokenizer_reference: str, output: str | Path, *,
                              max_n: int = 4, min_count: int = 2) -> NgramCounts:
    """Count the n-grams (n ≤ ``max_n``) of the tokenized corpus's passages, [CLS]/[SEP] stripped, into ``output``."""
    tokenizer = models.load_tokenizer(tokenizer_reference)
    corpus = read_token_shards(token_shards, tokenizer)
    counts = count_ngrams((corpus[i][1:-1] for i in range(len(corpus))), len(tokenizer), max_n, min_count)
    counts.save(output)
    return counts


def pmi(counts: NgramCounts, ngrams: np.ndarray) -> np.ndarray:
    """Eq. 7 generalised to n-grams: log p(w₁…wₙ) − Σᵢ log p(wᵢ) for ``ngrams`` [..., n] → float64 [...].

    For n = 2 this is Eq. 7; for n > 2 it compares the n-gram with its tokens drawn independently, so it
    grows with how much the n-gram's tokens occur together beyond chance.
    """
    ngrams = np.asarray(ngrams)
    return _log_probability(counts, ngrams.shape[-1], counts.pack(ngrams)) - _log_probability(counts, 1, ngrams).sum(-1)


def _log_probability(counts: NgramCounts, n: int, keys: np.ndarray) -> np.ndarray:
    """log(count / number of n-grams of length n in the corpus); a corpus without any n-gram of length n counts 1."""
    return np.log(counts.count(n, keys)) - np.log(max(int(counts.totals[n - 1]), 1))


def ami_importance(input_ids: np.ndarray, valid: np.ndarray, counts: NgramCounts, window: int = 4) -> np.ndarray:
    """Eq. 8: each token's average PMI over the n-grams (2 ≤ n ≤ ``window``) ending at it plus those starting at it.

    ``input_ids`` [B, L] token ids; ``valid`` [B, L] marks content tokens. n-grams lie inside contiguous valid
    positions: one that would reach a special token, padding or the row's edge is dropped. Each side is
    averaged over its available n-grams (not divided by L − 1), so a token near a boundary is not penalised;
    a side with no n-gram adds 0, so a token with none on either side, and every invalid position, gets 0.
    Returns float32 [B, L].
    """
    if not 2 <= window <= counts.max_n:
        raise ValueError(f"window {window} needs n-gram counts up to n = {window}, have up to {counts.max_n}")
    valid = np.asarray(valid, dtype=bool)
    ids = np.where(valid, input_ids, 0)
    length = ids.shape[1]
    left_sum, left_terms = np.zeros(ids.shape), np.zeros(ids.shape)
    right_sum, right_terms = np.zeros(ids.shape), np.zeros(ids.shape)
    for n in range(2, min(window, length) + 1):
        inside = sliding_window_view(valid, n, axis=1).all(-1)  # [B, L − n + 1]: n-gram s covers s … s + n − 1
        values = np.where(inside, pmi(counts, sliding_window_view(ids, n, axis=1)), 0.0)
        left_sum[:, n - 1:] += values  # the n-gram ends at token s + n − 1
        left_terms[:, n - 1:] += inside
        right_sum[:, :length - n + 1] += values  # the n-gram starts at token s
        right_terms[:, :length - n + 1] += inside
    return (_side_mean(left_sum, left_terms) + _side_mean(right_sum, right_terms)).astype(np.float32)


def _side_mean(total: np.ndarray, terms: np.ndarray) -> np.ndarray:
    return np.divide(total, terms, out=np.zeros_like(total), where=terms > 0)


def importance_aware_mask(importance: torch.Tensor, eligible: torch.Tensor, rate: float, sigma: float = 1.0,
                          generator: torch.Generator | None = None) -> torch.Tensor:
    """Algorithm 1 on each row: mask the ⌊n_eligible · rate⌋ eligible tokens of highest perturbed importance.

    ``importance`` [B, L] (finite), ``eligible`` [B, L] bool. Each eligible token's importance gets N(0, σ)
    noise (σ the standard deviation; footnote 3 sets it, and so the variance, to 1); ineligible tokens are
    never masked. ``generator`` must live on ``importance.device``. Returns bool [B, L].
    """
    if not 0.0 <= rate <= 1.0 or sigma < 0:
        raise ValueError(f"need 0 ≤ rate ≤ 1 and sigma ≥ 0, got rate {rate}, sigma {sigma}")
    noise = torch.randn(importance.shape, generator=generator, device=importance.device)
    perturbed = torch.where(eligible, importance.float() + sigma * noise, float("-inf"))
    rank = perturbed.argsort(dim=1, descending=True).argsort(dim=1)  # 0 = most important in its row
    masked_per_row = _masked_counts(importance.shape[1], rate).to(importance.device)[eligible.sum(dim=1)]
    return (rank < masked_per_row[:, None]) & eligible


def _masked_counts(length: int, rate: float) -> torch.Tensor:
    """⌊n · rate⌋ for n = 0 … length (Algorithm 1, line 6), in float64 on the CPU so any device can index it."""
    return (torch.arange(length + 1, dtype=torch.float64) * rate).floor().long()

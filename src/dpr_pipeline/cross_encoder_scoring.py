"""Inference with the re-ranker's θ(q, d): scoring pairs, re-ranking a TREC run, and teacher scores for distillation.

Pairs are tokenized once, sorted by token length (longest first, so that an out-of-memory batch shows at the
start) and padded per batch, which wastes little compute on padding. With ``bf16`` the forward pass runs under
bf16 autocast where the device supports it natively (a GPU, a CPU with AMX); scores come back as float32 in
input order.

A re-ranked run keeps its tail, as re-ranking toolkits report it: the re-ranked top ``depth`` hits, then the
first stage's remaining hits in their order, scored below every re-ranked hit, so recall at depths beyond the
re-ranked ones is the first stage's.

Teacher scoring (the scores Retriever_distill learns from, Eq. 5) is sharded: ``score_teacher_shard`` scores a
contiguous slice of the negatives artifact's rows, so a cluster can run every shard in parallel, and
``merge_teacher_shards`` concatenates the shards into one negatives artifact.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .data.schemas import read_artifact, write_artifact
from .errors import DataError
from .data.corpus_shards import corpus_shard_bounds, iter_corpus_rows, open_corpus
from .models import autocast, default_device, load_cross_encoder, load_tokenizer, passage_text
from .runs import read_trec_run, write_trec_run
from .training.groups import check_negatives_known, read_texts

log = logging.getLogger(__name__)

# Query and passage share max_length; longest_first trims the longer of the two token by token, so a short
# query stays whole (as "only_second" would keep it) while a query longer than the budget does not fail.
# It is also what sentence_transformers.CrossEncoder uses, so both score a saved re-ranker alike.
TRUNCATION = "longest_first"
TOKENIZE_CHUNK = 4096
TEACHER_SOURCE = "teacher"


def encode_pairs(tokenizer, queries: Sequence[str], passages: Sequence[str], *, max_length: int) -> dict:
    """Padded tensors (input_ids, attention_mask …) of the concatenated (query, passage) pairs."""
    return dict(tokenizer(list(queries), list(passages), truncation=TRUNCATION, max_length=max_length,
                          padding=True, return_tensors="pt"))


@dataclass(frozen=True)
class TokenizedPairs:
    """Every pair's token arrays (input_ids, and token_type_ids where the model has them), stored flat."""
    tokens: dict[str, np.ndarray]
    offsets: np.ndarray   # pair i is tokens[key][offsets[i]:offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def padded_batch(self, indices: np.ndarray, pad_token_id: int, padding_side: str) -> dict[str, torch.Tensor]:
        """The pairs ``indices`` padded to the longest of them, with their attention mask."""
        lengths = self.lengths[indices]
        width = int(lengths.max())
        batch = {key: np.full((len(indices), width), pad_token_id if key == "input_ids" else 0, dtype=np.int64)
                 for key in self.tokens}
        batch["attention_mask"] = np.zeros((len(indices), width), dtype=np.int64)
        for row, (index, length) in enumerate(zip(indices, lengths)):
            columns = slice(width - length, width) if padding_side == "left" else slice(0, length)
            for key, flat in self.tokens.items():
                batch[key][row, columns] = flat[self.offsets[index]:self.offsets[index + 1]]
            batch["attention_mask"][row, columns] = 1
        return {key: torch.from_numpy(value) for key, value in batch.items()}


def tokenize_pairs(tokenizer, queries: Sequence[str], passages: Sequence[str], *, max_length: int) -> TokenizedPairs:
    """Tokenize all pairs once, in chunks, keeping int32 arrays rather than Python lists (millions of pairs)."""
    parts: dict[str, list[np.ndarray]] = {}
    lengths = []
    for start in range(0, len(queries), TOKENIZE_CHUNK):
        encoded = tokenizer(list(queries[start:start + TOKENIZE_CHUNK]), list(passages[start:start + TOKENIZE_CHUNK]),
                            truncation=TRUNCATION, max_length=max_length, return_attention_mask=False)
        lengths.extend(len(ids) for ids in encoded["input_ids"])
        for key, sequences in encoded.items():
            parts.setdefault(key, []).append(np.fromiter((t for seq in sequences for t in seq), dtype=np.int32))
    tokens = {key: np.concatenate(chunks) for key, chunks in parts.items()}
    return TokenizedPairs(tokens, np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]))


def score_pairs(model: torch.nn.Module, tokenizer, queries: list[str], passages: list[str], *, max_length: int,
                batch_size: int, description: str = "scoring pairs", bf16: bool = False) -> np.ndarray:
    """θ(query_i, passage_i) for every i, as float32 in input order (the model's single logit)."""
    if len(queries) != len(passages):
        raise ValueError(f"{len(queries)} queries but {len(passages)} passages: score_pairs needs one per pair")
    scores = np.empty(len(queries), dtype=np.float32)
    if not queries:
        return scores
    pairs = tokenize_pairs(tokenizer, queries, passages, max_length=max_length)
    order = np.argsort(-pairs.lengths, kind="stable")
    device = next(model.parameters()).device
    model.eval()
    with torch.inference_mode(), autocast(device, bf16):
        for start in tqdm(range(0, len(order), batch_size), desc=description, mininterval=5,
                          total=-(-len(order) // batch_size)):
            indices = order[start:start + batch_size]
            batch = pairs.padded_batch(indices, tokenizer.pad_token_id, tokenizer.padding_side)
            logits = model(**{key: value.to(device) for key, value in batch.items()}).logits
            scores[indices] = logits[:, 0].float().cpu().numpy()
    return scores


def load_scorer(model_dir: str | Path) -> tuple[torch.nn.Module, object]:
    """A saved re-ranker and its tokenizer, on the GPU when there is one."""
    return load_cross_encoder(str(model_dir)).to(default_device()), load_tokenizer(str(model_dir))


def _check_run_known(run: pd.DataFrame, run_path: str | Path, passages: dict[str, str], queries: dict[str, str],
                     queries_path: str | Path, corpus_path: str | Path) -> None:
    unknown_query = next((q for q in run["query_id"].unique() if q not in queries), None)
    if unknown_query is not None:
        raise DataError(run_path, f"query {unknown_query!r} is not in the queries artifact {queries_path}",
                        "re-rank a run of the same dataset and split as the queries artifact")
    unknown_doc = next((d for d in run["doc_id"].unique() if d not in passages), None)
    if unknown_doc is not None:
        raise DataError(run_path, f"document {unknown_doc!r} is not in the corpus {corpus_path}",
                        "re-rank a run retrieved from the same dataset's corpus")


def rerank_run(model_dir: str | Path, run_path: str | Path, corpus_path: str | Path, queries_path: str | Path,
               output_run: str | Path, *, depth: int, max_length: int, batch_size: int, tag: str,
               bf16: bool = False) -> None:
    """Re-score each query's top ``depth`` hits of a TREC run with θ(q, d), sorted by θ, followed by the
    query's remaining hits (:func:`append_tail`).

    Every query of the run must be in the queries artifact and every document in the corpus. Ties keep the
    run's order.
    """
    passages, queries = read_texts(corpus_path, queries_path)
    run = read_trec_run(run_path)
    ranked = run.assign(rank=run.groupby("query_id", sort=False).cumcount())
    top = ranked[ranked["rank"] < depth].reset_index(drop=True)
    _check_run_known(top, run_path, passages, queries, queries_path, corpus_path)
    model, tokenizer = load_scorer(model_dir)
    log.info("re-ranking %d hits of %d queries (top %d) from %s", len(top), top["query_id"].nunique(), depth,
             run_path)
    scores = score_pairs(model, tokenizer, [queries[q] for q in top["query_id"]],
                         [passages[d] for d in top["doc_id"]], max_length=max_length, batch_size=batch_size,
                         description="re-ranking", bf16=bf16)
    reranked = top.assign(score=scores).sort_values(["query_id", "score"], ascending=[True, False], kind="stable")
    tails = {qid: hits["doc_id"].tolist() for qid, hits in ranked[ranked["rank"] >= depth].groupby("query_id")}
    write_trec_run(((qid, append_tail(list(zip(hits["doc_id"], hits["score"].astype(float))), tails.get(qid, [])))
                    for qid, hits in reranked.groupby("query_id", sort=False)), output_run, tag)


def append_tail(reranked: list[tuple[str, float]], tail: list[str]) -> list[tuple[str, float]]:
    """The re-ranked hits (sorted by score), then the first stage's remaining hits in their order, scored
    ``lowest re-ranked score − 1, − 2, …``: below every re-ranked hit and without ties, so every evaluation
    tool ranks them as written."""
    lowest = min((score for _, score in reranked), default=0.0)
    return reranked + [(doc_id, lowest - rank) for rank, doc_id in enumerate(tail, start=1)]


def shard_slice(num_rows: int, shard: int, num_shards: int) -> slice:
    """Rows of ``shard``: contiguous, sizes differing by at most one, together covering every row in order."""
    return slice(*corpus_shard_bounds(num_rows, shard, num_shards))


def _split_per_row(scores: np.ndarray, counts: list[int]) -> list[list[float]]:
    return [part.tolist() for part in np.split(scores, np.cumsum(counts)[:-1])] if counts else []


def read_passages(corpus_path: str | Path, doc_ids: set[str]) -> dict[str, str]:
    """Passage strings (``title text``) of ``doc_ids`` only, streamed from the corpus artifact batch by batch,
    so that a teacher shard job's memory follows its shard's passages, not the corpus (8.8M for MS MARCO).
    Ids not in the corpus are simply absent (the caller reports them)."""
    corpus = open_corpus(corpus_path)
    passages: dict[str, str] = {}
    for batch in iter_corpus_rows(corpus, 0, corpus.metadata.num_rows):
        ids = batch.column("doc_id").to_pylist()
        wanted = [i for i, doc_id in enumerate(ids) if doc_id in doc_ids]
        if wanted:
            titles, texts = batch.column("title").to_pylist(), batch.column("text").to_pylist()
            for i in wanted:
                passages[ids[i]] = passage_text(titles[i], texts[i] or "")
    return passages


def score_teacher_shard(model_dir: str | Path, negatives_path: str | Path, corpus_path: str | Path,
                        queries_path: str | Path, output_path: str | Path, *, shard: int, num_shards: int,
                        max_length: int, batch_size: int, bf16: bool = False) -> None:
    """θ of every (query, positive) and (query, negative) pair of one shard's rows, in the negatives schema.

    The shard's rows are written with ``positive_scores``/``negative_scores`` replaced by the teacher's
    scores (an empty shard writes an empty artifact).
    """
    negatives = read_artifact(negatives_path, "negatives")
    rows_slice = shard_slice(len(negatives), shard, num_shards)
    rows = negatives.iloc[rows_slice].reset_index(drop=True)
    del negatives
    needed = {d for ids in (*rows["positive_ids"], *rows["negative_ids"]) for d in ids}
    passages = read_passages(corpus_path, needed)
    query_table = read_artifact(queries_path, "queries")
    queries = dict(zip(query_table["query_id"], query_table["text"]))
    check_negatives_known(rows, negatives_path, passages, queries, first_row=rows_slice.start + 1)
    positive_counts = rows["positive_ids"].map(len).tolist()
    negative_counts = rows["negative_ids"].map(len).tolist()
    query_texts, passage_texts = [], []
    for qid, positives, negs in zip(rows["query_id"], rows["positive_ids"], rows["negative_ids"]):
        query_texts.extend([queries[qid]] * (len(positives) + len(negs)))
        passage_texts.extend(passages[d] for d in (*positives, *negs))
    log.info("teacher shard %d of %d: rows %d–%d, %d pairs", shard, num_shards, rows_slice.start,
             rows_slice.stop, len(query_texts))
    model, tokenizer = load_scorer(model_dir)
    scores = score_pairs(model, tokenizer, query_texts, passage_texts, max_length=max_length,
                         batch_size=batch_size, description=f"teacher shard {shard}", bf16=bf16)
    per_row = _split_per_row(scores, [p + n for p, n in zip(positive_counts, negative_counts)])
    scored = rows.assign(  # object columns, so that an empty shard keeps list-typed score columns
        positive_scores=pd.Series([s[:p] for s, p in zip(per_row, positive_counts)], index=rows.index, dtype=object),
        negative_scores=pd.Series([s[p:] for s, p in zip(per_row, positive_counts)], index=rows.index, dtype=object))
    write_artifact(scored, output_path, "negatives",
                   metadata={"source": TEACHER_SOURCE, "teacher": str(model_dir), "shard": str(shard),
                             "num_shards": str(num_shards)})


def _check_scores_finite(frame: pd.DataFrame, path: str | Path) -> None:
    for row, (positive_scores, negative_scores) in enumerate(
            zip(frame["positive_scores"], frame["negative_scores"]), start=1):
        if not np.isfinite(np.asarray([*positive_scores, *negative_scores], dtype=np.float64)).all():
            raise DataError(path, "a teacher score is missing (NaN) or infinite",
                            "delete this shard and rerun its teacher_scores job", row=row)


def merge_teacher_shards(shard_paths: Sequence[str | Path], output_path: str | Path) -> None:
    """Concatenate teacher shards in order into one negatives artifact, after checking every score and query id."""
    if not shard_paths:
        raise ValueError("merge_teacher_shards needs at least one shard")
    frames, first_shard_of = [], {}
    for path in shard_paths:
        frame = read_artifact(path, "negatives")
        _check_scores_finite(frame, path)
        for row, qid in enumerate(frame["query_id"], start=1):
            if qid in first_shard_of:
                raise DataError(path, f"query {qid!r} is also in shard {first_shard_of[qid]}",
                                "score every shard from the same negatives artifact and number of shards", row=row)
            first_shard_of[qid] = str(path)
        frames.append(frame)
    merged = pd.concat(frames, ignore_index=True)
    write_artifact(merged, output_path, "negatives",
                   metadata={"source": TEACHER_SOURCE, "shards": str(len(shard_paths))})
    log.info("teacher scores of %d queries from %d shards written to %s", len(merged), len(shard_paths),
             output_path)

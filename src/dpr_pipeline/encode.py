"""Encoding passages and queries with the bi-encoder: L2-normalised last-layer [CLS] vectors.

Vectors come from :func:`dpr_pipeline.models.cls_vectors`, the function training uses, so a trained model
encodes here exactly as it scored during training. :func:`encode_texts` tokenizes every text once, sorts
the texts by token length (longest first) and pads each batch only to its own longest text, so batches carry
almost no padding; rows come back in the input order. A batch holds at most ``batch_size × max_length``
tokens: ``batch_size`` texts of the longest kind, proportionally more shorter ones (short texts in small
batches leave the matrix multiplications underused), with the peak memory of a full batch of long texts.

A corpus is encoded in shards (:func:`encode_corpus_shard`): each job streams only its own contiguous
range of ``corpus.parquet`` rows, so its memory is bounded by the shard, not by the corpus.
"""

from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm.auto import tqdm

from . import models
from .data.schemas import check_schema, read_artifact
from .errors import DataError
from .io import atomic_outputs

logger = logging.getLogger(__name__)

VECTOR_DTYPES = ("float16", "float32")
_TOKENIZE_CHUNK = 8192  # texts per tokenizer call: token ids are kept as one int32 array, not Python lists
_READ_BATCH = 4096  # Parquet rows per streamed record batch
_REBUILD = "delete it and rerun the Snakemake rule that writes it"


def encode_texts(encoder: torch.nn.Module, tokenizer, texts: Sequence[str], *, max_length: int,
                 batch_size: int, device: str | torch.device | None = None,
                 progress: bool = False) -> np.ndarray:
    """Encode ``texts`` into a float32 array ``[len(texts), hidden_size]`` of unit-length [CLS] vectors.

    A batch is ``batch_size`` texts of ``max_length`` tokens, or more texts when they are shorter (the same
    token budget, padding included). ``device`` defaults to where the encoder already is; on CUDA the
    forward pass runs under bf16 autocast.
    """
    if batch_size < 1 or max_length < 2:
        raise ValueError(f"batch_size ({batch_size}) must be >= 1 and max_length ({max_length}) >= 2")
    device = torch.device(device) if device is not None else next(encoder.parameters()).device
    encoder.to(device).eval()
    vectors = np.empty((len(texts), encoder.config.hidden_size), dtype=np.float32)
    if not texts:
        return vectors
    flat, offsets = _tokenize(tokenizer, texts, max_length)
    with torch.inference_mode(), models.inference_autocast(device), \
            tqdm(total=len(texts), desc="encoding", unit="text", disable=not progress) as bar:
        for rows in _token_budget_batches(np.diff(offsets), batch_size * max_length):
            batch = tokenizer.pad({"input_ids": [flat[offsets[i]:offsets[i + 1]] for i in rows]},
                                  return_tensors="pt", return_attention_mask=True)
            vectors[rows] = models.cls_vectors(encoder, batch["input_ids"].to(device),
                                               batch["attention_mask"].to(device)).cpu().numpy()
            bar.update(len(rows))
    return vectors


def _tokenize(tokenizer, texts: Sequence[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """All texts' token ids (truncated, unpadded) as one flat int32 array and ``len(texts) + 1`` offsets."""
    pieces: list[np.ndarray] = []
    lengths = np.empty(len(texts), dtype=np.int64)
    for start in range(0, len(texts), _TOKENIZE_CHUNK):
        chunk = list(texts[start:start + _TOKENIZE_CHUNK])
        ids = tokenizer(chunk, truncation=True, max_length=max_length, padding=False,
                        return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        lengths[start:start + len(ids)] = [len(x) for x in ids]
        pieces.append(np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32,
                                  count=int(lengths[start:start + len(ids)].sum())))
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.concatenate(pieces), offsets


def _token_budget_batches(lengths: np.ndarray, budget: int) -> Iterator[np.ndarray]:
    """Indices of the texts, longest first, in batches of at most ``budget`` tokens once padded."""
    order = np.argsort(-lengths, kind="stable")
    start = 0
    while start < len(order):
        size = max(1, budget // max(1, int(lengths[order[start]])))  # the first text of a batch is its longest
        yield order[start:start + size]
        start += size


def corpus_shard_bounds(num_rows: int, shard: int, num_shards: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of shard ``shard`` (0-based) of ``num_shards`` contiguous, near-equal shards."""
    if num_shards < 1 or not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} of {num_shards}: need num_shards >= 1 and 0 <= shard < num_shards")
    return shard * num_rows // num_shards, (shard + 1) * num_rows // num_shards


def encode_corpus_shard(model_path: str, corpus_parquet: str | Path, output_vectors: str | Path,
                        output_ids: str | Path, *, shard: int, num_shards: int, max_length: int,
                        batch_size: int, dtype: str = "float16") -> None:
    """Encode one shard of ``corpus.parquet`` into ``output_vectors`` (.npy) and ``output_ids`` (.parquet).

    Row ``i`` of the vectors is the passage whose ``doc_id`` is row ``i`` of the ids file. Only the shard's
    rows are read; a shard without rows (more shards than passages) writes empty files of the right shape.
    """
    if dtype not in VECTOR_DTYPES:
        raise ValueError(f"dtype {dtype!r}: use one of {VECTOR_DTYPES}")
    corpus = _open_corpus(corpus_parquet)
    start, stop = corpus_shard_bounds(corpus.metadata.num_rows, shard, num_shards)
    doc_ids, passages = _read_shard(corpus, Path(corpus_parquet), start, stop)
    logger.info("shard %d/%d: encoding rows %d-%d of %s", shard, num_shards, start, stop, corpus_parquet)
    began = time.perf_counter()
    vectors = encode_texts(models.load_encoder(model_path), models.load_tokenizer(model_path), passages,
                           max_length=max_length, batch_size=batch_size, device=models.default_device(),
                           progress=True).astype(dtype)
    elapsed = time.perf_counter() - began
    logger.info("shard %d/%d: %d passages in %.1f s (%.0f/s)", shard, num_shards, len(passages), elapsed,
                len(passages) / max(elapsed, 1e-9))
    with atomic_outputs(output_vectors, output_ids) as (vectors_tmp, ids_tmp):
        with open(vectors_tmp, "wb") as out:
            np.save(out, vectors)
        pq.write_table(pa.table({"doc_id": pa.array(doc_ids, type=pa.string())}), ids_tmp)


def _open_corpus(path: str | Path) -> pq.ParquetFile:
    """The corpus artifact as a ParquetFile (nothing read but the footer), its schema checked."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "the corpus artifact does not exist", "run the Snakemake rule that writes it")
    try:
        corpus = pq.ParquetFile(path)
    except Exception as err:  # corrupt or not Parquet
        raise DataError(path, f"not a readable Parquet file ({err})", _REBUILD) from None
    check_schema(corpus.schema_arrow, "corpus", path)
    return corpus


def _read_shard(corpus: pq.ParquetFile, path: Path, start: int, stop: int) -> tuple[list[str], list[str]]:
    """Doc ids and passage strings (``title text``) of rows ``[start, stop)``; an empty doc_id is an error."""
    doc_ids: list[str] = []
    passages: list[str] = []
    for batch in _iter_rows(corpus, start, stop):
        for doc_id, title, text in zip(*(batch.column(name).to_pylist() for name in ("doc_id", "title", "text"))):
            if not doc_id or not doc_id.strip():
                raise DataError(path, "empty doc_id", _REBUILD, row=start + len(doc_ids) + 1)
            doc_ids.append(doc_id)
            passages.append(models.passage_text(title, text or ""))
    return doc_ids, passages


def _iter_rows(corpus: pq.ParquetFile, start: int, stop: int) -> Iterator[pa.RecordBatch]:
    """Stream rows ``[start, stop)``: only the row groups that overlap them are read, batch by batch."""
    groups, first_row = [], None
    row = 0
    for index in range(corpus.metadata.num_row_groups):
        size = corpus.metadata.row_group(index).num_rows
        if row < stop and row + size > start:
            groups.append(index)
            first_row = row if first_row is None else first_row
        row += size
    if not groups:
        return
    position = first_row
    for batch in corpus.iter_batches(batch_size=_READ_BATCH, row_groups=groups,
                                     columns=["doc_id", "title", "text"]):
        low, high = max(start - position, 0), min(stop - position, batch.num_rows)
        if low < high:
            yield batch.slice(low, high - low)
        position += batch.num_rows
        if position >= stop:
            return


def encode_queries(model_path: str, queries_parquet: str | Path, *, max_length: int,
                   batch_size: int) -> tuple[list[str], np.ndarray]:
    """Query ids and their float32 vectors, in the file's order."""
    queries = read_artifact(queries_parquet, "queries")
    vectors = encode_texts(models.load_encoder(model_path), models.load_tokenizer(model_path),
                           queries["text"].fillna("").tolist(), max_length=max_length, batch_size=batch_size,
                           device=models.default_device())
    return queries["query_id"].tolist(), vectors

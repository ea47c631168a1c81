"""Encoding passages and queries with the bi-encoder: L2-normalised pooled last-layer vectors.

Vectors come from :class:`dpr_pipeline.models.embedding.TextEncoder`, the object training uses, with the pooling the
model folder records, so a trained model encodes here exactly as it scored during training. :func:`encode_texts`
tokenizes every text once (``TOKENIZE_ROWS`` at a time, the next chunk while this one is encoded), sorts each
chunk's texts by token length (longest first) and pads each batch only to its own longest text, so batches carry
almost no padding (~1 % at MS MARCO's lengths; packing them would not pay); rows come back in the input order.
A batch holds at most
``batch_size × max_length`` tokens: ``batch_size`` texts of the longest kind, proportionally more shorter ones
(short texts in small batches leave the matrix multiplications underused), with the peak memory of a full batch
of long texts. Batches are cut from the token array in pinned memory and copied without blocking, a batch without
padding gets no attention mask, and vectors come back in bulk transfers of ``GATHER_ROWS`` rows, so the host
keeps ahead of a GPU. Passages get the model's passage prompt and queries its query prompt
(:class:`~dpr_pipeline.models.embedding.Prompts`, as ``encode_document`` / ``encode_query`` apply them), named in the
log.

A corpus is encoded in shards (:func:`encode_corpus_shard`): each job streams only its own contiguous
range of ``corpus.parquet`` rows, so its memory is bounded by the shard, not by the corpus.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm.auto import tqdm

from dpr_pipeline.atomic_writes import atomic_outputs
from dpr_pipeline.data.corpus_shards import corpus_shard_bounds, open_corpus, read_corpus_rows
from dpr_pipeline.data.schemas import read_artifact
from dpr_pipeline.models import devices, token_arrays
from dpr_pipeline.models import loading as models
from dpr_pipeline.models.embedding import TextEncoder, load_text_encoder
from dpr_pipeline.models.refs import max_seq_length

logger = logging.getLogger(__name__)

VECTOR_DTYPES = ("float16", "float32")
GATHER_ROWS = 65536  # vectors held on the device before one bulk copy back (768 dims: 200 MB)
TOKENIZE_ROWS = token_arrays.TOKENIZE_ROWS


def encode_texts(encoder: TextEncoder, tokenizer, texts: Sequence[str], *, max_length: int,
                 batch_size: int, device: str | torch.device | None = None, bf16: bool = False,
                 progress: bool = False, gather_rows: int = GATHER_ROWS, prompt: str = "",
                 tokenize_rows: int = TOKENIZE_ROWS) -> np.ndarray:
    """Encode ``texts`` into a float32 array ``[len(texts), hidden_size]`` of unit-length vectors.

    ``prompt``: the text put before each one (the encoder's ``prompts.query`` for queries, ``prompts.passage``
    for passages), cut with it at ``max_length`` tokens, as sentence-transformers does.

    A batch is ``batch_size`` texts of ``max_length`` tokens, or more texts when they are shorter (the same
    token budget, padding included). ``device`` defaults to where the encoder already is; with ``bf16`` the
    forward pass runs under bf16 autocast where the device supports it natively (:func:`devices.uses_bf16`).

    The host runs ahead of a GPU: the texts are tokenised ``tokenize_rows`` at a time, the next chunk in a worker
    thread while this one is encoded (the Rust tokenizer releases the GIL), and sorted by length within their chunk;
    each batch is cut from its chunk's tokenisation
    (:meth:`~dpr_pipeline.models.token_arrays.TokenArrays.padded_batch`, in pinned host memory on CUDA, copied without
    blocking); a batch whose texts all have its length goes in without an attention mask (nothing for
    transformers to check on the host, which waits for the GPU once per masked batch); and the vectors stay where
    they were computed until ``gather_rows`` of them are copied back in one transfer, on every device alike. A
    vector that is not finite is an error naming its text.
    """
    if batch_size < 1 or max_length < 2:
        raise ValueError(f"batch_size ({batch_size}) must be >= 1 and max_length ({max_length}) >= 2")
    device = torch.device(device) if device is not None else devices.model_device(encoder)
    encoder.to(device).eval()
    vectors = np.empty((len(texts), encoder.config.hidden_size), dtype=np.float32)
    if not texts:
        return vectors
    prompt_tokens = encoder.prompt_tokens(tokenizer, prompt)

    def tokenized(start: int) -> token_arrays.TokenArrays:
        chunk = texts[start:start + tokenize_rows]
        return token_arrays.tokenize(tokenizer, [prompt + text for text in chunk] if prompt else chunk,
                                     max_length=max_length, token_type_ids=False)

    pin = device.type == "cuda"  # pinned host memory: the copy to the GPU runs while the host prepares the next
    pending: list[tuple[np.ndarray, torch.Tensor]] = []  # (rows, their vectors still on the device)
    reaching = 0
    logger.info("encoding %d texts: %s on %s", len(texts),
                "bf16 autocast" if devices.uses_bf16(device, bf16) else "float32", device)
    with torch.inference_mode(), devices.autocast(device, bf16), \
            concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize") as pool, \
            tqdm(total=len(texts), desc="encoding", unit="text", disable=not progress) as bar:
        ahead = pool.submit(tokenized, 0)
        for start in range(0, len(texts), tokenize_rows):
            tokens = ahead.result()
            if start + tokenize_rows < len(texts):
                ahead = pool.submit(tokenized, start + tokenize_rows)
            lengths = tokens.lengths
            reaching += int((lengths >= max_length).sum())
            for rows in _token_budget_batches(lengths, batch_size * max_length):
                batch = tokens.padded_batch(rows, tokenizer.pad_token_id, tokenizer.padding_side, pin_memory=pin)
                padded = lengths[rows].min() < lengths[rows].max()  # known here: no device value is read for it
                pending.append((rows + start, encoder(
                    batch["input_ids"].to(device, non_blocking=pin),
                    batch["attention_mask"].to(device, non_blocking=pin) if padded else None, prompt_tokens)))
                if sum(len(r) for r, _ in pending) >= gather_rows:
                    _gather(pending, vectors, texts)
                bar.update(len(rows))
        _gather(pending, vectors, texts)
    logger.info("%d of %d texts reach max_length %d tokens (those longer are truncated)", reaching, len(texts),
                max_length)
    return vectors


def _gather(pending: list[tuple[np.ndarray, torch.Tensor]], vectors: np.ndarray, texts: Sequence[str]) -> None:
    """Copy the vectors of several batches into their rows of ``vectors`` (one transfer, one synchronisation
    for all), check that they are finite, and forget them."""
    if not pending:
        return
    rows = np.concatenate([r for r, _ in pending])
    vectors[rows] = torch.cat([output for _, output in pending]).cpu().numpy()
    pending.clear()
    broken = ~np.isfinite(vectors[rows]).all(axis=1)
    if broken.any():
        row = int(rows[np.flatnonzero(broken)[0]])
        raise FloatingPointError(
            f"the encoder gave a non-finite vector (NaN or inf) for {int(broken.sum())} text(s), the first text "
            f"{row} ({texts[row][:80]!r}); an index would silently drop it from every result list. Fix: encode "
            f"again with the stage's bf16: false to see whether low precision caused it, else check the model")


def _token_budget_batches(lengths: np.ndarray, budget: int) -> Iterator[np.ndarray]:
    """Indices of the texts, longest first, in batches of at most ``budget`` tokens once padded."""
    order = np.argsort(-lengths, kind="stable")
    start = 0
    while start < len(order):
        size = max(1, budget // max(1, int(lengths[order[start]])))  # the first text of a batch is its longest
        yield order[start:start + size]
        start += size


def encode_corpus_shard(model_path: str, corpus_parquet: str | Path, output_vectors: str | Path,
                        output_ids: str | Path, *, shard: int, num_shards: int, max_length: int | None,
                        batch_size: int, dtype: str = "float16", bf16: bool = False) -> None:
    """Encode one shard of ``corpus.parquet`` into ``output_vectors`` (.npy) and ``output_ids`` (.parquet), each
    passage cut at ``max_length`` tokens (None: the model's own :func:`~dpr_pipeline.models.refs.max_seq_length`).

    Row ``i`` of the vectors is the passage whose ``doc_id`` is row ``i`` of the ids file. Only the shard's
    rows are read; a shard without rows (more shards than passages) writes empty files of the right shape.
    """
    if dtype not in VECTOR_DTYPES:
        raise ValueError(f"dtype {dtype!r}: use one of {VECTOR_DTYPES}")
    corpus = open_corpus(corpus_parquet)
    start, stop = corpus_shard_bounds(corpus.metadata.num_rows, shard, num_shards)
    doc_ids, passages = read_corpus_rows(corpus, Path(corpus_parquet), start, stop)
    logger.info("shard %d/%d: encoding rows %d-%d of %s", shard, num_shards, start, stop, corpus_parquet)
    began = time.perf_counter()
    max_length = resolved_length(model_path, max_length, "passages")
    encoder = load_text_encoder(model_path)
    logger.info("%s: %s", model_path, encoder.prompts.describe())
    vectors = encode_texts(encoder, models.load_tokenizer(model_path), passages, max_length=max_length,
                           batch_size=batch_size, device=devices.default_device(), bf16=bf16, progress=True,
                           prompt=encoder.prompts.passage).astype(dtype)
    elapsed = time.perf_counter() - began
    logger.info("shard %d/%d: %d passages in %.1f s (%.0f/s)", shard, num_shards, len(passages), elapsed,
                len(passages) / max(elapsed, 1e-9))
    with atomic_outputs(output_vectors, output_ids) as (vectors_tmp, ids_tmp):
        with open(vectors_tmp, "wb") as out:
            np.save(out, vectors)
        pq.write_table(pa.table({"doc_id": pa.array(doc_ids, type=pa.string())}), ids_tmp)


def resolved_length(model_path: str, max_length: int | None, what: str) -> int:
    """``max_length``, or where it is None the model's own maximum (its folder's ``max_seq_length``, as BEIR and
    MTEB encode), logged with what it cuts."""
    if max_length is None:
        max_length = max_seq_length(model_path)
        logger.info("%s are cut at %d tokens, the model's own max_seq_length", what, max_length)
    return max_length


def encode_queries(model_path: str, queries_parquet: str | Path, *, max_length: int | None,
                   batch_size: int, bf16: bool = False) -> tuple[list[str], np.ndarray]:
    """Query ids and their float32 vectors, in the file's order (``max_length`` None: the model's own
    max_seq_length)."""
    max_length = resolved_length(model_path, max_length, "queries")
    queries = read_artifact(queries_parquet, "queries")
    encoder = load_text_encoder(model_path)
    logger.info("%s: %s", model_path, encoder.prompts.describe())
    vectors = encode_texts(encoder, models.load_tokenizer(model_path), queries["text"].fillna("").tolist(),
                           max_length=max_length, batch_size=batch_size, device=devices.default_device(),
                           bf16=bf16, prompt=encoder.prompts.query)
    return queries["query_id"].tolist(), vectors

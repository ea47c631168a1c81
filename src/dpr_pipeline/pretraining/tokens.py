"""The tokenized corpus that pre-training reads: token-id shards written in parallel, one Parquet file each.

Each shard holds the passages of one contiguous range of ``corpus.parquet`` rows (``title text``, as the
retrievers see them), tokenized with special tokens and truncated to ``max_length``. Token ids are stored in
the smallest unsigned integer type that holds the vocabulary (uint16 for BERT's 30,522 tokens: 8.8M MS MARCO
passages of ≤ 144 tokens take ≈ 2 GB). The tokenizer is recorded in the Parquet metadata (its reference, its
vocabulary size and a hash of its vocabulary), and :func:`read_token_shards` refuses shards written by
another tokenizer than the one pre-training uses.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import models
from ..data.corpus_shards import corpus_shard_bounds, open_corpus, read_corpus_rows
from ..data.schemas import open_parquet
from ..errors import DataError
from ..io import atomic_output

log = logging.getLogger(__name__)

META_PREFIX = "dpr_pipeline.tokens."
_TOKENIZE_CHUNK = 8192
_REBUILD = "delete the token shards and rerun the tokenize_corpus rule"


def vocabulary_hash(tokenizer) -> str:
    """A short hash of the token → id mapping: equal hashes mean the same token ids."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds every token id."""
    return np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32)


def tokenize_corpus_shard(tokenizer_reference: str, corpus_parquet: str | Path, output: str | Path, *,
                          shard: int, num_shards: int, max_length: int) -> None:
    """Tokenize shard ``shard`` of ``num_shards`` of the corpus into ``output`` (Parquet: doc_id, input_ids)."""
    tokenizer = models.load_tokenizer(tokenizer_reference)
    corpus = open_corpus(corpus_parquet)
    start, stop = corpus_shard_bounds(corpus.metadata.num_rows, shard, num_shards)
    doc_ids, passages = read_corpus_rows(corpus, Path(corpus_parquet), start, stop)
    dtype = token_dtype(len(tokenizer))
    sequences: list[np.ndarray] = []
    for begin in range(0, len(passages), _TOKENIZE_CHUNK):
        encoded = tokenizer(passages[begin:begin + _TOKENIZE_CHUNK], truncation=True, max_length=max_length,
                            return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        sequences += [np.asarray(ids, dtype=dtype) for ids in encoded]
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.concatenate(sequences) if sequences else np.zeros(0, dtype=dtype)
    input_ids = pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32() if offsets[-1] < 2**31 else pa.int64()),
                                         pa.array(flat))
    metadata = {"tokenizer": tokenizer_reference, "vocab_size": str(len(tokenizer)),
                "vocab_hash": vocabulary_hash(tokenizer), "max_length": str(max_length),
                "shard": str(shard), "num_shards": str(num_shards)}
    table = pa.table({"doc_id": pa.array(doc_ids, type=pa.string()), "input_ids": input_ids})
    table = table.replace_schema_metadata({META_PREFIX + k: v for k, v in metadata.items()})
    log.info("shard %d/%d: %d passages, %d tokens (mean %.1f)", shard, num_shards, len(doc_ids), len(flat),
             lengths.mean() if len(lengths) else 0.0)
    with atomic_output(output) as tmp:
        pq.write_table(table, tmp)


@dataclass(frozen=True)
class TokenizedCorpus:
    """Every passage's token ids (with [CLS]/[SEP]) as one flat array plus offsets."""

    flat: np.ndarray
    offsets: np.ndarray
    vocab_size: int
    max_length: int

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        return self.flat[self.offsets[index]:self.offsets[index + 1]]

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])


def read_token_metadata(path: str | Path) -> dict[str, str]:
    schema = open_parquet(path, "token shard", missing_fix="run the tokenize_corpus rule",
                          corrupt_fix=_REBUILD).schema_arrow
    raw = schema.metadata or {}
    metadata = {k.decode()[len(META_PREFIX):]: v.decode() for k, v in raw.items()
                if k.decode().startswith(META_PREFIX)}
    missing = {"tokenizer", "vocab_size", "vocab_hash", "max_length"} - metadata.keys()
    if missing or "input_ids" not in schema.names:
        raise DataError(path, f"not a token shard (missing {sorted(missing) or ['input_ids column']})", _REBUILD)
    return metadata


def read_token_shards(paths: Sequence[str | Path], tokenizer) -> TokenizedCorpus:
    """Read the shards in order, checking that ``tokenizer`` (the one pre-training uses) wrote them."""
    expected = vocabulary_hash(tokenizer)
    flats, lengths = [], []
    max_length = 0
    for path in paths:
        metadata = read_token_metadata(path)
        if metadata["vocab_hash"] != expected:
            raise DataError(path, f"tokenized with {metadata['tokenizer']!r}, whose vocabulary differs from the "
                            "pre-training model's tokenizer", _REBUILD)
        max_length = max(max_length, int(metadata["max_length"]))
        column = pq.read_table(path, columns=["input_ids"]).column("input_ids").combine_chunks()
        flats.append(column.values.to_numpy(zero_copy_only=False))
        lengths.append(np.diff(column.offsets.to_numpy()))
    flat = np.concatenate(flats) if flats else np.zeros(0, dtype=token_dtype(len(tokenizer)))
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths) if lengths else [])]).astype(np.int64)
    if len(offsets) < 2:
        raise DataError(paths[0] if paths else Path("."), "the token shards hold no passage",
                        "check that the corpus is not empty")
    return TokenizedCorpus(flat=flat, offsets=offsets, vocab_size=len(tokenizer), max_length=max_length)

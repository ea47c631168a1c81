"""The tokenized corpus that pre-training reads: token-id shards written in parallel, one Arrow file each.

Each shard holds the passages of one contiguous range of ``corpus.parquet`` rows (``title text``, as the
retrievers see them), tokenized with special tokens and truncated to ``max_length``. Token ids are stored in
the smallest unsigned integer type that holds the vocabulary (uint16 for BERT's 30,522 tokens: 8.8M MS MARCO
passages of ≤ 144 tokens take ≈ 2 GB). The tokenizer is recorded in the file's schema metadata (its reference,
its vocabulary size and a hash of its vocabulary), and :func:`read_token_shards` refuses shards written by
another tokenizer than the one pre-training uses. The shards are uncompressed Arrow IPC files that
:func:`read_token_shards` memory-maps: the token ids are views of the files, in the page cache once per node
for all of a job's processes, not a copy per process.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.data.corpus_shards import corpus_shard_bounds, open_corpus, read_corpus_rows
from dpr_pipeline.data.schemas import map_arrow_file
from dpr_pipeline.errors import DataError
from dpr_pipeline.models import loading as models

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
    """Tokenize shard ``shard`` of ``num_shards`` of the corpus into ``output`` (Arrow IPC: doc_id, input_ids)."""
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
    with atomic_output(output) as tmp, pa.OSFile(str(tmp), "wb") as sink, \
            pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


class TokenizedCorpus:
    """Every passage's token ids (with [CLS]/[SEP]), shard after shard: each shard's ids one flat array (a view
    of its memory-mapped file) plus its offsets."""

    def __init__(self, shards: Sequence[tuple[np.ndarray, np.ndarray]], vocab_size: int, max_length: int):
        self.shards = [(flat, offsets) for flat, offsets in shards if len(offsets) > 1]
        self.starts = np.cumsum([0] + [len(offsets) - 1 for _, offsets in self.shards])
        self.vocab_size = vocab_size
        self.max_length = max_length

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: int) -> np.ndarray:
        shard = int(np.searchsorted(self.starts, index, side="right")) - 1
        flat, offsets = self.shards[shard]
        row = index - self.starts[shard]
        return flat[offsets[row]:offsets[row + 1]]

    @property
    def num_tokens(self) -> int:
        return int(sum(offsets[-1] - offsets[0] for _, offsets in self.shards))


def _token_metadata(path: str | Path, table: pa.Table) -> dict[str, str]:
    """The tokenizer a shard records (``dpr_pipeline.tokens.*``), or a DataError: not a token shard."""
    schema = table.schema
    raw = schema.metadata or {}
    metadata = {k.decode()[len(META_PREFIX):]: v.decode() for k, v in raw.items()
                if k.decode().startswith(META_PREFIX)}
    missing = {"tokenizer", "vocab_size", "vocab_hash", "max_length"} - metadata.keys()
    if missing or "input_ids" not in schema.names:
        raise DataError(path, f"not a token shard (missing {sorted(missing) or ['input_ids column']})", _REBUILD)
    return metadata


def read_token_shards(paths: Sequence[str | Path], tokenizer) -> TokenizedCorpus:
    """Map the shards in order, checking that ``tokenizer`` (the one pre-training uses) wrote them."""
    expected = vocabulary_hash(tokenizer)
    shards, max_length = [], 0
    for path in paths:
        table = map_arrow_file(path, "token shard", "run the tokenize_corpus rule", _REBUILD)
        metadata = _token_metadata(path, table)
        if metadata["vocab_hash"] != expected:
            raise DataError(path, f"tokenized with {metadata['tokenizer']!r}, whose vocabulary differs from the "
                            "pre-training model's tokenizer", _REBUILD)
        max_length = max(max_length, int(metadata["max_length"]))
        for column in table.column("input_ids").chunks:   # one chunk per written table: views, no copy
            shards.append((column.values.to_numpy(), column.offsets.to_numpy()))
    corpus = TokenizedCorpus(shards, vocab_size=len(tokenizer), max_length=max_length)
    if len(corpus) == 0:
        raise DataError(paths[0] if paths else Path("."), "the token shards hold no passage",
                        "check that the corpus is not empty")
    return corpus

"""Texts (or text pairs) tokenised once into flat int32 arrays, and model batches cut from them.

Corpus and query encoding (:mod:`.encode`) and the re-ranker's pair scoring (:mod:`.pair_scoring`) tokenise
all their inputs in one pass (chunked tokenizer calls, token ids kept as one int32 array per key rather than Python
lists: millions of texts), sort them by token length and cut each batch from the arrays, padded only to its own
longest row. Cutting a batch is a few vectorised numpy steps: ``tokenizer.pad`` loops over rows in Python and
took ~15 ms of host time per 256 × 144 batch, as long as a GPU's forward pass over it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

TOKENIZE_CHUNK = 4096  # texts per tokenizer call
TOKENIZE_ROWS = 65536  # texts (or pairs) tokenised at a time by encoding and scoring, the next chunk in a worker thread


@dataclass(frozen=True)
class TokenArrays:
    """Every row's token arrays (``input_ids``, and ``token_type_ids`` where asked for), stored flat."""
    tokens: dict[str, np.ndarray]
    offsets: np.ndarray   # row i is tokens[key][offsets[i]:offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def padded_batch(self, rows: np.ndarray, pad_token_id: int | None, padding_side: str = "right",
                     pin_memory: bool = False) -> dict[str, torch.Tensor]:
        """Rows ``rows`` as int64 tensors padded to the longest of them (``input_ids`` with ``pad_token_id``,
        other keys with 0) on ``padding_side``, with their ``attention_mask``; in pinned host memory with
        ``pin_memory`` (a CUDA copy from there need not block)."""
        if pad_token_id is None:
            raise ValueError("the tokenizer has no padding token: batches of texts of different lengths need one")
        lengths = self.lengths[rows]
        columns = np.arange(lengths.max())
        start = (len(columns) - lengths)[:, None] if padding_side == "left" else np.zeros((len(rows), 1), np.int64)
        real = (columns >= start) & (columns < start + lengths[:, None])
        source = (self.offsets[rows][:, None] + columns - start)[real]
        batch = {}
        for key, flat in self.tokens.items():
            batch[key] = torch.empty(real.shape, dtype=torch.long, pin_memory=pin_memory)
            values = batch[key].numpy()   # filled through numpy: torch.full took ~40x longer on a busy 2-core CPU
            values.fill(pad_token_id if key == "input_ids" else 0)
            values[real] = flat[source]
        batch["attention_mask"] = torch.empty(real.shape, dtype=torch.long, pin_memory=pin_memory)
        batch["attention_mask"].numpy()[:] = real
        return batch


def tokenize(tokenizer, texts: Sequence[str], pairs: Sequence[str] | None = None, *, max_length: int,
             truncation: bool | str = True, token_type_ids: bool | None = None) -> TokenArrays:
    """``texts`` (or the pairs (texts[i], pairs[i])) tokenised and truncated to ``max_length``, unpadded;
    ``token_type_ids``: whether to keep them (None: where the tokenizer's model takes them)."""
    parts: dict[str, list[np.ndarray]] = {}
    lengths: list[int] = []
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        chunk = [list(texts[start:start + TOKENIZE_CHUNK])]
        if pairs is not None:
            chunk.append(list(pairs[start:start + TOKENIZE_CHUNK]))
        encoded = tokenizer(*chunk, truncation=truncation, max_length=max_length, padding=False,
                            return_attention_mask=False, return_token_type_ids=token_type_ids)
        lengths.extend(len(ids) for ids in encoded["input_ids"])
        for key, sequences in encoded.items():
            parts.setdefault(key, []).append(np.fromiter((t for seq in sequences for t in seq), dtype=np.int32))
    tokens = {key: np.concatenate(chunks) for key, chunks in parts.items()}
    return TokenArrays(tokens, np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]))

"""Inference with the re-ranker's θ(q, d): loading it and scoring (query, passage) pairs. Its two uses:
:mod:`.reranking` (re-ranking a TREC run) and :mod:`.teacher_scores` (teacher scores for distillation).

Pairs are tokenized once, sorted by token length (longest first, so that an out-of-memory batch shows at the
start) and padded per batch, which wastes little compute on padding. With ``bf16`` the forward pass runs under
bf16 autocast where the device supports it natively (a GPU, a CPU with AMX); scores come back as float32 in
input order.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .devices import autocast, default_device, model_device, to_device
from .models import load_cross_encoder, load_tokenizer

log = logging.getLogger(__name__)

# Query and passage share max_length; longest_first trims the longer of the two token by token, so a short
# query stays whole (as "only_second" would keep it) while a query longer than the budget does not fail.
# It is also what sentence_transformers.CrossEncoder uses, so both score a saved re-ranker alike.
TRUNCATION = "longest_first"
TOKENIZE_CHUNK = 4096


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
    device = model_device(model)
    model.eval()
    with torch.inference_mode(), autocast(device, bf16):
        for start in tqdm(range(0, len(order), batch_size), desc=description, mininterval=5,
                          total=-(-len(order) // batch_size)):
            indices = order[start:start + batch_size]
            batch = pairs.padded_batch(indices, tokenizer.pad_token_id, tokenizer.padding_side)
            logits = model(**to_device(batch, device)).logits
            scores[indices] = logits[:, 0].float().cpu().numpy()
    return scores


def load_scorer(model_dir: str | Path) -> tuple[torch.nn.Module, object]:
    """A saved re-ranker and its tokenizer, on the GPU when there is one."""
    return load_cross_encoder(str(model_dir)).to(default_device()), load_tokenizer(str(model_dir))

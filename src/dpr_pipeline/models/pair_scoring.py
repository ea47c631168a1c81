"""Inference with the re-ranker's θ(q, d): loading it and scoring (query, passage) pairs. Its two uses:
:mod:`dpr_pipeline.reranking.rerank` (re-ranking a TREC run) and :mod:`dpr_pipeline.reranking.teacher_scores`
(teacher scores for distillation); the re-ranker's trainer (:mod:`dpr_pipeline.training.cross_encoder`) scores its
dev pairs with it too.

Pairs are tokenized once, sorted by token length (longest first, so that an out-of-memory batch shows at the
start) and padded per batch, which wastes little compute on padding. With ``bf16`` the forward pass runs under
bf16 autocast where the device supports it natively (a GPU, a CPU with AMX); scores come back as float32 in
input order.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from dpr_pipeline.models import token_arrays
from dpr_pipeline.models.devices import autocast, default_device, model_device, to_device
from dpr_pipeline.models.loading import load_cross_encoder, load_tokenizer

log = logging.getLogger(__name__)

# Query and passage share max_length; longest_first trims the longer of the two token by token, so a short
# query stays whole (as "only_second" would keep it) while a query longer than the budget does not fail.
# It is also what sentence_transformers.CrossEncoder uses, so both score a saved re-ranker alike.
TRUNCATION = "longest_first"


def encode_pairs(tokenizer, queries: Sequence[str], passages: Sequence[str], *, max_length: int) -> dict:
    """Padded tensors (input_ids, attention_mask …) of the concatenated (query, passage) pairs."""
    return dict(tokenizer(list(queries), list(passages), truncation=TRUNCATION, max_length=max_length,
                          padding=True, return_tensors="pt"))


def score_pairs(model: torch.nn.Module, tokenizer, queries: list[str], passages: list[str], *, max_length: int,
                batch_size: int, description: str = "scoring pairs", bf16: bool = False) -> np.ndarray:
    """θ(query_i, passage_i) for every i, as float32 in input order (the model's single logit)."""
    if len(queries) != len(passages):
        raise ValueError(f"{len(queries)} queries but {len(passages)} passages: score_pairs needs one per pair")
    scores = np.empty(len(queries), dtype=np.float32)
    if not queries:
        return scores
    pairs = token_arrays.tokenize(tokenizer, queries, passages, max_length=max_length, truncation=TRUNCATION)
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

"""Inference with the re-ranker's θ(q, d): loading it and scoring (query, passage) pairs. Its two uses:
:mod:`dpr_pipeline.reranking.rerank` (re-ranking a TREC run) and :mod:`dpr_pipeline.reranking.teacher_scores`
(teacher scores for distillation); the re-ranker's trainer (:mod:`dpr_pipeline.training.cross_encoder`) scores its
dev pairs with it too.

Pairs are tokenized once, :data:`~dpr_pipeline.models.token_arrays.TOKENIZE_ROWS` at a time (the next chunk in a
worker thread while this one is scored: the Rust tokenizer releases the GIL, and on a GPU tokenising is as slow as
the model), sorted by token length within their chunk (longest first, so that an out-of-memory batch shows at the
start) and padded per batch, which wastes little compute on padding. A chunk's scores stay on the device until its
last batch (one copy back, one wait for the device). With ``bf16`` the forward pass runs under bf16 autocast where
the device supports it natively (a GPU, a CPU with AMX); scores come back as float32 in input order.
"""

from __future__ import annotations

import concurrent.futures
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
    device = model_device(model)
    pin = device.type == "cuda"  # pinned host memory: the copy to the GPU runs while the host prepares the next
    model.eval()

    def tokenized(start: int) -> token_arrays.TokenArrays:
        end = start + token_arrays.TOKENIZE_ROWS
        return token_arrays.tokenize(tokenizer, queries[start:end], passages[start:end], max_length=max_length,
                                     truncation=TRUNCATION)

    with torch.inference_mode(), autocast(device, bf16), \
            concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize") as pool, \
            tqdm(total=len(queries), desc=description, unit="pair", mininterval=5) as bar:
        ahead = pool.submit(tokenized, 0)
        for start in range(0, len(queries), token_arrays.TOKENIZE_ROWS):
            pairs = ahead.result()
            if start + token_arrays.TOKENIZE_ROWS < len(queries):
                ahead = pool.submit(tokenized, start + token_arrays.TOKENIZE_ROWS)
            order = np.argsort(-pairs.lengths, kind="stable")
            chunk_scores = []
            for first in range(0, len(order), batch_size):
                batch = pairs.padded_batch(order[first:first + batch_size], tokenizer.pad_token_id,
                                           tokenizer.padding_side, pin_memory=pin)
                chunk_scores.append(model(**to_device(batch, device, non_blocking=pin)).logits[:, 0])
                bar.update(len(chunk_scores[-1]))
            scores[start + order] = torch.cat(chunk_scores).float().cpu().numpy()
    return scores


def load_scorer(model_dir: str | Path) -> tuple[torch.nn.Module, object]:
    """A saved re-ranker and its tokenizer, on the GPU when there is one."""
    return load_cross_encoder(str(model_dir)).to(default_device()), load_tokenizer(str(model_dir))

"""Which tokens a pre-training input corrupts, and how: pure tensor functions on ``[B, L]`` batches.

* :func:`content_positions` — the positions that can be corrupted and predicted: real tokens that are not
  [CLS], [SEP] or padding ("all positions" of SimLM's loss means all of these).
* :func:`random_mask` — ``Mask(x, p)``: each content position independently with probability ``p``.
* :func:`nested_mask` — SimLM's decoder mask: a superset of the encoder's mask with overall rate
  ``p_dec`` ("any replaced token in x_enc is also replaced in x_dec", simlm.md §3.1).
* :func:`bert_corrupt` — BERT's 80 % [MASK] / 10 % random token / 10 % unchanged, for the MLM objectives.

Randomness comes from torch's global generator (or an explicit ``generator``), so the trainer's saved RNG
state makes a resumed run draw the same masks.
"""

from __future__ import annotations

import torch


def content_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids) -> torch.Tensor:
    """True at real, non-special tokens."""
    special = torch.isin(input_ids, torch.as_tensor(list(special_ids), device=input_ids.device))
    return attention_mask.bool() & ~special


def _uniform(shape, device, generator: torch.Generator | None) -> torch.Tensor:
    return torch.rand(shape, device=device, generator=generator)


def random_mask(eligible: torch.Tensor, rate: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Each eligible position is masked independently with probability ``rate``."""
    return eligible & (_uniform(eligible.shape, eligible.device, generator) < rate)


def nested_mask(inner: torch.Tensor, eligible: torch.Tensor, inner_rate: float, rate: float,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """A mask containing ``inner`` (drawn at ``inner_rate``) whose overall rate is ``rate``: every other eligible
    position is added with probability (rate − inner_rate) / (1 − inner_rate)."""
    if not inner_rate <= rate <= 1:
        raise ValueError(f"the outer mask rate {rate} must lie between the inner rate {inner_rate} and 1")
    extra = (rate - inner_rate) / (1 - inner_rate) if inner_rate < 1 else 0.0
    return inner | random_mask(eligible & ~inner, extra, generator)


def bert_corrupt(input_ids: torch.Tensor, mask: torch.Tensor, mask_token_id: int, vocab_size: int,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """BERT's masking of the ``mask`` positions: 80 % [MASK], 10 % a uniformly random token, 10 % unchanged."""
    draw = _uniform(input_ids.shape, input_ids.device, generator)
    random_tokens = torch.randint(vocab_size, input_ids.shape, device=input_ids.device, generator=generator)
    corrupted = torch.where(mask & (draw < 0.8), torch.full_like(input_ids, mask_token_id), input_ids)
    return torch.where(mask & (draw >= 0.8) & (draw < 0.9), random_tokens, corrupted)

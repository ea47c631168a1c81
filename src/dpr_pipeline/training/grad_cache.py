"""Gradient caching (GradCache: Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited
Setup"; sentence-transformers' ``CachedMultipleNegativesRankingLoss``, Tevatron's ``GradCache``): a contrastive step
over a process's share of the batch in chunks, with the memory of one chunk and the gradient of the whole share.

A loss over representations that couples every example of the batch (Eq. 3's in-batch and cross-device negatives)
cannot be summed over micro-batches. It can be split at the representations instead:

1. each chunk's representations (a bi-encoder's query and passage vectors) without a graph;
2. the loss over all of them (gathered from every process) and its gradient with respect to this process's
   representations: the *cache*, a few vectors per example;
3. each chunk again, with a graph, back-propagating ⟨representation, cached gradient⟩: by the chain rule the
   parameters receive exactly the gradient of the whole-batch loss. Each chunk's RNG state (dropout) is restored
   from step 1, so the second pass computes the same representations as the first.

A stage's loss declares the split as a :class:`CachedLoss`; the trainer runs :func:`cached_step` when the stage's
``micro_batch_size`` is smaller than a process's share of the batch, else the one pass ``loss(represent(batch))``.
"""

from __future__ import annotations

import contextlib
from typing import Protocol, runtime_checkable

import torch

from dpr_pipeline.training.distributed import Distributed


@runtime_checkable
class CachedLoss(Protocol):
    """A loss in two parts: ``represent`` (the model's forward on one collated batch: a tuple of tensors, one row
    per example or per text) and ``loss`` (the loss of the whole step from every chunk's representations, joined
    in order, and the chunks' collated batches, whose other tensors it reads). ``loss`` gathers across processes
    itself; called as ``loss_fn(model, batch, dist)`` it is the one-pass step."""

    def represent(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, ...]: ...

    def loss(self, representations: tuple[torch.Tensor, ...], batches: list[dict],
             dist: Distributed) -> torch.Tensor: ...


def joined(batches: list[dict], key: str) -> torch.Tensor:
    """``key``'s tensors of the chunks' batches, concatenated in order (the whole share's)."""
    return batches[0][key] if len(batches) == 1 else torch.cat([batch[key] for batch in batches])


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def cached_step(model: torch.nn.Module, batches: list[dict], loss_fn: CachedLoss, dist: Distributed,
                device: torch.device, amp=None) -> torch.Tensor:
    """Back-propagate ``loss_fn`` over the chunks ``batches`` (collated, on ``device``) by gradient caching and
    return the loss, detached. The gradient is scaled by ``dist.world_size``, as the trainer scales a loss over the
    gathered batch (DDP averages the processes' gradients; the global loss needs their sum). DDP synchronises once,
    in the last chunk's backward. ``amp``: the autocast context the forward passes run in (None: none)."""
    amp = amp if amp is not None else contextlib.nullcontext()
    states, parts = [], []
    with torch.no_grad():
        for batch in batches:
            states.append(_rng_state(device))
            with amp:
                parts.append(loss_fn.represent(model, batch))
    cache = tuple(torch.cat([part[i] for part in parts]).detach().requires_grad_() for i in range(len(parts[0])))
    del parts
    with amp:
        loss = loss_fn.loss(cache, batches, dist)
    (loss * dist.world_size).backward()       # reaches the cache only: it has no graph into the model
    grads = [c.grad if c.grad is not None else torch.zeros_like(c) for c in cache]
    offsets = [0] * len(cache)
    for batch_index, batch in enumerate(batches):
        last = batch_index == len(batches) - 1
        _set_rng_state(states[batch_index], device)  # the same dropout as the first pass
        with model.no_sync() if dist.enabled and not last else contextlib.nullcontext():
            with amp:
                out = loss_fn.represent(model, batch)
            rows = [len(o) for o in out]
            surrogate = sum((o.to(g.dtype) * g[start:start + n]).sum()
                            for o, g, start, n in zip(out, grads, offsets, rows))
            surrogate.backward()
        offsets = [start + n for start, n in zip(offsets, rows)]
    return loss.detach()

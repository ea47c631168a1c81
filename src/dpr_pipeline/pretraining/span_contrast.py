"""coCondenser's training step (cocondenser.md Eq. 7, §3.3): the Condenser MLM plus the span-pair contrastive loss over
the global batch, with gradient caching when the batch does not fit; ``pretraining.methods`` declares it as the
``cocondenser`` method's step."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from dpr_pipeline.training.losses import at_least_float32, span_contrastive_loss


def _no_sync(model: nn.Module, last: bool):
    return model.no_sync() if hasattr(model, "no_sync") and not last else contextlib.nullcontext()


def cocondenser_step(chunk_size: int):
    """coCondenser's step (Eq. 7): mean Condenser MLM + mean span contrastive loss over the global batch of
    span pairs (vectors gathered across processes). It back-propagates itself and returns the loss detached.

    ``chunk_size`` > 0: gradient caching (§3.3). A no-grad pass computes every span's [CLS] vector; the
    contrastive loss's gradient with respect to those vectors (Eq. 9) is cached; then each chunk of
    ``chunk_size`` spans is run again with gradients and back-propagates v·h + its MLM share (Eq. 12), so
    only one chunk's activations are held at a time. The RNG state is replayed so that both passes draw the
    same masks and dropout. The gradient equals the one-pass gradient.
    """

    def compute_loss(model, batch: dict, dist) -> torch.Tensor:
        inputs = (batch["input_ids"], batch["attention_mask"], batch["content"])
        scale = dist.world_size  # DDP averages over processes; the global contrastive loss needs their sum
        if chunk_size <= 0 or chunk_size >= len(inputs[0]):
            out = model(*inputs)
            mlm = out["mlm_sum"] / out["masked"].clamp(min=1)
            contrastive = span_contrastive_loss(dist.gather(out["cls"]))
            (mlm + scale * contrastive).backward()
            return (mlm + contrastive).detach()
        chunks = [slice(i, i + chunk_size) for i in range(0, len(inputs[0]), chunk_size)]
        devices = [inputs[0].device] if inputs[0].device.type == "cuda" else []
        states, vectors, masked = [], [], 0
        with torch.no_grad():
            for part in chunks:
                states.append((torch.get_rng_state(), torch.cuda.get_rng_state(devices[0]) if devices else None))
                out = model(*(x[part] for x in inputs))
                vectors.append(out["cls"])
                masked += int(out["masked"])
        cached = at_least_float32(torch.cat(vectors)).requires_grad_()
        contrastive = span_contrastive_loss(dist.gather(cached))
        contrastive.backward()
        masked = max(masked, 1)
        mlm = 0.0
        for index, (part, (cpu_state, cuda_state)) in enumerate(zip(chunks, states)):
            torch.set_rng_state(cpu_state)  # the same masks and dropout as in the first pass
            if cuda_state is not None:
                torch.cuda.set_rng_state(cuda_state, devices[0])
            with _no_sync(model, last=index == len(chunks) - 1):
                out = model(*(x[part] for x in inputs))
                (scale * (at_least_float32(out["cls"]) * cached.grad[part]).sum() + out["mlm_sum"] / masked).backward()
            mlm += out["mlm_sum"].item() / masked
        return (contrastive + mlm).detach()

    return compute_loss

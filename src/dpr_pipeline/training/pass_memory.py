"""A training pass's peak GPU memory, estimated from its tokens and its model's size, and the micro-batch that fits
a GPU (``micro_batch_size: auto``); no torch.

The estimate is linear in the tokens of one forward-and-backward pass: the model's float32 weights, gradients and
AdamW moments (16 bytes a parameter) plus the kept activations, :data:`MIB_PER_TOKEN_AT_BASE` a token at
BERT-base's width x depth (768 x 12), in proportion at other shapes, twice that without bf16 autocast. The figure
is measured (benchmarks/README.md, one H200, bf16, PyTorch's SDPA attention, 2026-11-27): Retriever₁'s one pass of
64 queries x (32 + 16 x 144) tokens peaked at 57.9 GiB (estimate 57.8), its gradient cache in chunks of 16 and 4
queries at 16.0 and 5.5 GiB (15.7, 5.1), the re-ranker's 8 x 64 pairs x 192 tokens at 38.6 GiB (38.6) and
micro-batches of 2 queries at 11.2 GiB (10.9). On 2026-11-28 a GPU's share at 2 and 4 GPUs: Retriever₁'s 32 x
(32 + 16 x 144) at 29.7 GiB (29.7), the student's 32 x (32 + 24 x 144) at 43.6 (43.6) and in chunks of 16 at 23.0
(22.6), its 16 x (32 + 24 x 144) at 22.6 (22.6). The attention's memory is linear in the length under SDPA's fused
kernels; an eager attention's quadratic part is not in it.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.training.schedule import TrainingSettings

log = logging.getLogger(__name__)

#: Kept activations per token of a bf16 training pass at BERT-base's shape (module docstring).
MIB_PER_TOKEN_AT_BASE = 0.385
BASE_WIDTH_DEPTH = 768 * 12
#: float32 weights, their gradients and AdamW's two moments.
STATE_BYTES_PER_PARAMETER = 16
#: The share of a GPU's memory a pass may plan to use (the allocator's fragmentation, CUDA's context, the gradient
#: cache's representations and the loss beside it).
USABLE_SHARE = 0.85
AUTO = "auto"


def pass_gib(tokens: int, *, parameters: int, hidden_size: int, layers: int, bf16: bool = True) -> float:
    """Estimated peak GPU memory (GiB) of a training pass over ``tokens`` tokens of a model of that size."""
    per_token = MIB_PER_TOKEN_AT_BASE * hidden_size * layers / BASE_WIDTH_DEPTH * (1 if bf16 else 2)
    return parameters * STATE_BYTES_PER_PARAMETER / 2**30 + tokens * per_token / 1024


def model_size(model) -> dict[str, int]:
    """``parameters``, ``hidden_size`` and ``layers`` of a Hugging Face model (what :func:`pass_gib` takes)."""
    return {"parameters": sum(parameter.numel() for parameter in model.parameters()),
            "hidden_size": model.config.hidden_size, "layers": model.config.num_hidden_layers}


def fitting_micro_batch(share: int, tokens_per_example: int, gpu_gib: float, *, parameters: int, hidden_size: int,
                        layers: int, bf16: bool = True, setting: str = "micro_batch_size") -> int | None:
    """The micro-batch of a GPU with ``gpu_gib`` of memory for a process's ``share`` of examples of
    ``tokens_per_example`` tokens each: None (one pass) where the whole share fits :data:`USABLE_SHARE` of it, else
    the largest divisor of ``share`` that does; a ConfigError where one example alone does not fit."""
    budget = USABLE_SHARE * gpu_gib
    model = {"parameters": parameters, "hidden_size": hidden_size, "layers": layers, "bf16": bf16}
    if pass_gib(share * tokens_per_example, **model) <= budget:
        return None
    fits = [size for size in range(share - 1, 0, -1)
            if share % size == 0 and pass_gib(size * tokens_per_example, **model) <= budget]
    if not fits:
        raise ConfigError(
            f"{setting}: auto: one example of {tokens_per_example} tokens needs an estimated "
            f"{pass_gib(tokens_per_example, **model):.1f} GiB, more than {USABLE_SHARE:.0%} of this GPU's "
            f"{gpu_gib:.0f} GiB. Fix: shorter sequences or fewer negatives per query, gradient_checkpointing: true, "
            "or GPUs with more memory")
    return fits[0]


def resolve_micro_batch(training: TrainingSettings, share: int, tokens_per_example: int, gpu_gib: float | None, *,
                        parameters: int, hidden_size: int, layers: int, setting: str) -> TrainingSettings:
    """``training`` with ``micro_batch_size: auto`` replaced by :func:`fitting_micro_batch`'s choice for a GPU of
    ``gpu_gib`` (None: no GPU, the whole share in one pass), else as it is. The gradient cache's step equals the one
    pass's at any chunk size, so the choice changes the memory, not the model."""
    if training.micro_batch_size != AUTO:
        return training
    model = {"parameters": parameters, "hidden_size": hidden_size, "layers": layers, "bf16": training.bf16}
    chunk = None if gpu_gib is None else fitting_micro_batch(share, tokens_per_example, gpu_gib, **model,
                                                             setting=setting)
    log.info("%s: auto: %s (%d examples of %d tokens a process; est. %.1f GiB a pass%s)", setting,
             f"chunks of {chunk}" if chunk else "one pass", share, tokens_per_example,
             pass_gib((chunk or share) * tokens_per_example, **model),
             f" on a {gpu_gib:.0f} GiB GPU" if gpu_gib is not None else ", no GPU")
    return replace(training, micro_batch_size=chunk)

"""Where inference and training run, and in which precision: the GPU when there is one; bf16 autocast where the
device computes it natively (a GPU, a CPU with Intel AMX or AVX512-BF16), full precision elsewhere."""

from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path

import torch


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s parameters: where every tensor fed to it must be."""
    return next(model.parameters()).device


def to_device(batch: dict, device: torch.device, non_blocking: bool = False) -> dict:
    """``batch`` with every tensor (and tensor bundle with a ``to``, such as a packed batch) moved to ``device``
    (other values as they are): a model on a GPU takes no CPU index (``Expected all tensors to be on the same
    device``), so every batch goes through here on its way in."""
    return {key: value.to(device, non_blocking=non_blocking) if torch.is_tensor(value) or hasattr(value, "to")
            else value for key, value in batch.items()}


def default_device() -> torch.device:
    """Where inference runs: the GPU when there is one."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matrix products in hardware (Intel AMX or AVX512-BF16), where bf16
    autocast runs ~2.5x faster than float32; elsewhere it is emulated and slower, so it stays off."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


def uses_bf16(device: torch.device, requested: bool) -> bool:
    """bf16 autocast when asked for and the device runs it natively: a GPU, or a CPU with AMX/AVX512-BF16."""
    return requested and (device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16()))


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` where :func:`uses_bf16` says so; full precision otherwise."""
    if uses_bf16(device, bf16):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def timed(step, device: torch.device) -> float:
    """Seconds ``step()`` takes on ``device``, the GPU's queued work included (synchronised before and after)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - began

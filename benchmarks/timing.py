"""What the benchmarks beside this module share (imported as ``from timing import timed``: Python puts a script's
folder first on its path)."""

from __future__ import annotations

import time

import torch


def timed(step, device: torch.device) -> float:
    """Seconds ``step()`` takes on ``device``, the GPU's queued work included (synchronised before and after)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - began

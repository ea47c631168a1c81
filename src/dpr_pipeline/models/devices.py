"""Where inference and training run, and in which precision: the GPU when there is one; bf16 autocast where the
device computes it natively (a GPU, a CPU with Intel AMX or AVX512-BF16), full precision elsewhere."""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

import torch

from dpr_pipeline.errors import ConfigError

#: The variables a scheduler sets in a job it gave GPUs (Slurm's, and CUDA_VISIBLE_DEVICES naming devices).
GPU_ALLOCATION_VARIABLES = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_GPUS",
                            "CUDA_VISIBLE_DEVICES")
GPU_COUNT_VARIABLES = ("SLURM_GPUS_ON_NODE", "SLURM_GPUS")
#: Set to 1 where GPU jobs are meant to run on the CPU although GPUs were allocated (a Slurm with fake GPUs: the
#: rehearsal, tests/test_slurm.py).
ALLOW_CPU_VARIABLE = "DPR_PIPELINE_ALLOW_CPU"
#: Set to 0 to take the float32 path of a CPU without native bf16 on one that has it (with
#: ATEN_CPU_CAPABILITY=avx2 for PyTorch's kernels: `make test-avx2` emulates an AVX2-only machine).
CPU_BF16_VARIABLE = "DPR_PIPELINE_CPU_BF16"
#: The oldest NVIDIA driver each CUDA release of a torch wheel runs on (NVIDIA's CUDA toolkit release notes).
MIN_DRIVER = {"13.0": "580", "12.9": "575", "12.8": "570", "12.6": "560", "12.4": "550", "12.1": "530",
              "11.8": "520"}


def allocated_gpus(environ=os.environ) -> dict[str, str]:
    """The scheduler's GPU variables set in ``environ`` that give GPUs: not empty, not ``-1``/``none``/
    ``NoDevFiles``, and a count (``SLURM_GPUS``, ``SLURM_GPUS_ON_NODE``) not 0."""
    given = {}
    for name in GPU_ALLOCATION_VARIABLES:
        value = environ.get(name, "").strip()
        if value in ("", "-1", "none", "NoDevFiles") or (name in GPU_COUNT_VARIABLES and value == "0"):
            continue
        given[name] = value
    return given


def nvidia_driver() -> str | None:
    """The NVIDIA kernel driver's version on this machine, else None."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = [word for word in text.split() if word.count(".") >= 1 and word.replace(".", "").isdigit()]
    return found[0] if found else None


def require_cuda_where_allocated(environ=os.environ) -> None:
    """A job given GPUs (:func:`allocated_gpus`) whose torch sees no CUDA device stops here, naming the torch build,
    the driver it needs and the one found, and the fix, instead of running on the CPU for days. Unless
    ``DPR_PIPELINE_ALLOW_CPU=1`` says the CPU is meant."""
    allocated = allocated_gpus(environ)
    if not allocated or torch.cuda.is_available() or environ.get(ALLOW_CPU_VARIABLE) == "1":
        return
    built = torch.version.cuda
    needs = (f"built for CUDA {built}, which needs an NVIDIA driver {MIN_DRIVER[built]} or newer"
             if built in MIN_DRIVER else f"built for CUDA {built}" if built else "a CPU-only build")
    driver = nvidia_driver()
    given = ", ".join(f"{name}={value}" for name, value in allocated.items())
    raise ConfigError(
        f"this job was given GPUs ({given}) but torch {torch.__version__} ({needs}) sees no CUDA device; the "
        f"NVIDIA driver here is {driver or 'not found (no /proc/driver/nvidia/version)'}. It would run on the "
        "CPU instead. Fix: install the torch wheel for this driver in the jobs' environment (docs/cluster.md, "
        "\"torch and the NVIDIA driver\") and check it with `make gpu-check` on a GPU node; or set "
        f"{ALLOW_CPU_VARIABLE}=1 where the CPU is meant")


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s parameters: where every tensor fed to it must be."""
    return next(model.parameters()).device


def to_device(batch: dict, device: torch.device, non_blocking: bool = False) -> dict:
    """``batch`` with every tensor (and tensor bundle with a ``to``, such as a packed batch) moved to ``device``
    (other values as they are): a model on a GPU takes no CPU index (``Expected all tensors to be on the same
    device``), so every batch goes through here on its way in."""
    return {key: value.to(device, non_blocking=non_blocking) if torch.is_tensor(value) or hasattr(value, "to")
            else value for key, value in batch.items()}


def gpu_memory_gib(device: torch.device) -> float | None:
    """The total memory (GiB) of ``device`` when it is a GPU, else None."""
    return torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda" else None


def default_device() -> torch.device:
    """Where inference runs: the GPU when there is one (a job given GPUs without CUDA stops:
    :func:`require_cuda_where_allocated`)."""
    require_cuda_where_allocated()
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matrix products in hardware (Intel AMX or AVX512-BF16), where bf16
    autocast runs ~2.5x faster than float32; elsewhere it is emulated and slower, so it stays off. False also
    where ``DPR_PIPELINE_CPU_BF16=0`` says to act as such a CPU."""
    if os.environ.get(CPU_BF16_VARIABLE) == "0":
        return False
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

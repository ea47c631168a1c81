"""Multi-process training with ``torchrun``: process-group set-up and the all-gather behind cross-device negatives.

``torchrun --nproc_per_node N`` sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; ``Distributed.from_environment``
joins the process group (NCCL on GPUs, gloo on CPU). Without those variables everything runs in one process.
Over several nodes (:mod:`dpr_pipeline.training.nodes`) ``RANK`` and ``WORLD_SIZE`` count every node's processes
(the batch's slices, the gather, rank 0's checkpoints and logs), ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` this
node's (its GPU).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.stages import settings_block, shared_block

#: The training job's stage, which ``run_training`` passes to its torchrun processes (for error messages).
STAGE_VARIABLE = "DPR_PIPELINE_STAGE"


def visible_gpus() -> int:
    """The CUDA devices this process may use (``CUDA_VISIBLE_DEVICES`` applied); 0 without CUDA."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def stage_setting(stage: str, key: str) -> str | None:
    """Where stage ``stage``'s training setting ``key`` (``processes``, ``nodes``) lives: ``stages.<block>.<key>``
    of the block its own block overrides, if any (stages.py); None for a name that is no declared stage."""
    block = settings_block(stage)
    if block is None:
        return None
    return f"stages.{shared_block(block) or block}.{key}"


def check_processes(processes: int, gpus: int, stage: str) -> None:
    """``processes`` training processes on a node need one GPU each where there are GPUs: more processes than the
    ``gpus`` visible is a ConfigError naming the setting, the stage and both counts (torchrun would otherwise start,
    and rank ``gpus`` would die in ``torch.cuda.set_device`` with CUDA's ``invalid device ordinal``).

    Without a visible GPU any number of processes trains on the CPU (gloo), as the tests do with two."""
    if processes <= 1 or gpus == 0 or processes <= gpus:
        return
    setting = stage_setting(stage, "processes")
    named = setting or "processes (torchrun's --nproc_per_node)"
    raise ConfigError(
        f"{stage} training: {named} is {processes} (one process per GPU), but only {gpus} GPU"
        f"{'' if gpus == 1 else 's'} {'is' if gpus == 1 else 'are'} visible to this job. Fix: set "
        f"{'the dataset' + chr(39) + 's ' + setting if setting else 'processes'} to {gpus} or less, or run the job "
        f"where {processes} GPUs are visible (CUDA_VISIBLE_DEVICES, the cluster profile's GPUs per job)")


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    @classmethod
    def from_environment(cls) -> "Distributed":
        """Join the process group that ``torchrun`` describes in the environment, or run in one process."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size == 1:
            return cls()
        context = cls(rank=int(os.environ["RANK"]), world_size=world_size,
                      local_rank=int(os.environ.get("LOCAL_RANK", "0")))
        if not dist.is_initialized():
            # a torchrun started by hand with more processes than GPUs: the setting's error, not CUDA's
            on_this_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
            check_processes(max(on_this_node, context.local_rank + 1), visible_gpus(),
                            os.environ.get(STAGE_VARIABLE, "training"))
            if torch.cuda.is_available():
                torch.cuda.set_device(context.local_rank)
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        return context

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate every process's ``tensor`` along dim 0, in rank order.

        The slice from this process keeps its autograd graph (the others are constants), so a loss over the
        gathered tensors back-propagates into this process's encoder. Every process computes the same
        global loss; multiplying it by ``world_size`` before ``backward`` makes DDP's gradient average the
        gradient of that global loss.
        """
        if not self.enabled:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.detach().contiguous())
        parts[self.rank] = tensor
        return torch.cat(parts, dim=0)

    def any_process(self, flag: bool) -> bool:
        """Whether ``flag`` is true in any process (every process gets the same answer; one process: ``flag``)."""
        if not self.enabled:
            return flag
        value = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

"""Multi-process training with ``torchrun``: process-group set-up and the all-gather behind cross-device negatives.

``torchrun --nproc_per_node N`` sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; ``Distributed.from_environment``
joins the process group (NCCL on GPUs, gloo on CPU). Without those variables everything runs in one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


#: The training job's stage, which ``run_training`` passes to its torchrun processes (for error messages).
STAGE_VARIABLE = "DPR_PIPELINE_STAGE"


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
            from .launch import check_processes, visible_gpus

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

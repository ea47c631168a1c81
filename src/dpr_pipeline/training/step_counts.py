"""Ops and host synchronisations of one training step: the throughput benchmarks report them, tests hold a step
to none.

``count_ops_and_syncs(step)`` runs ``step()`` once under a ``TorchDispatchMode`` and counts every ATen op it
dispatches (forward, backward and the optimizer step) and, among them, those whose result the host must wait
for: an op whose output size depends on the data (``nonzero``, ``masked_select``, a boolean-mask index,
``unique`` …) or a tensor read back as a Python number (``_local_scalar_dense``: ``.item()``, ``bool(t)``,
``int(t)``). On a GPU each of those blocks the host until the queued work is done, so the host cannot run ahead.
The count is made the same way on every device (on a CPU those ops cost nothing extra, but they are the ones that
will wait on a GPU), except inside an optimizer's ``step``: PyTorch keeps AdamW's step counters on the CPU on every
device, so reading them waits for nothing; there only an op on a GPU tensor counts. On CUDA, ``cuda_syncs`` also
counts what ``torch.cuda.set_sync_debug_mode`` reports.
"""

from __future__ import annotations

import warnings
from collections import Counter

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

# Ops whose output shape (or value, read on the host) depends on the data.
SYNC_OPS = {"aten.nonzero.default", "aten.masked_select.default",
            "aten._local_scalar_dense.default", "aten.unique_consecutive.default", "aten._unique2.default",
            "aten.unique_dim.default", "aten.repeat_interleave.Tensor", "aten.masked_scatter.default",
            "aten.is_nonzero.default", "aten.equal.default"}


def _bool_index(func, args) -> bool:
    if str(func) not in ("aten.index.Tensor", "aten.index_put.default", "aten.index_put_.default"):
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()))


class _Counting(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops, self.syncs = Counter(), Counter()
        self.in_optimizer = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        self.ops[name] += 1
        if (name in SYNC_OPS or _bool_index(func, args)) and not (
                self.in_optimizer and args[0].device.type == "cpu"):
            self.syncs[name] += 1
        return func(*args, **(kwargs or {}))


def count_ops_and_syncs(step, device: torch.device) -> dict:
    """Ops and host synchronisations of one ``step()`` (run once here): totals and the syncing ops by name."""
    counting = _Counting()
    cuda = device.type == "cuda"
    hooks = [register_optimizer_step_pre_hook(
                 lambda *_: setattr(counting, "in_optimizer", True)),
             register_optimizer_step_post_hook(
                 lambda *_: setattr(counting, "in_optimizer", False))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.set_sync_debug_mode("warn")
        try:
            with counting:
                step()
        finally:
            for hook in hooks:
                hook.remove()
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
    result = {"ops": sum(counting.ops.values()), "syncs": sum(counting.syncs.values()),
              "sync_ops": dict(counting.syncs.most_common())}
    if cuda:
        result["cuda_syncs"] = sum("synchroniz" in str(w.message) for w in caught)
    return result

"""The training loop every stage uses: seeded batches, AMP, DDP, resumable checkpoints, a progress bar and a loss log.

A stage supplies three things:

* ``data`` with ``len(data)`` examples and ``data.example(index, epoch)``, deterministic in its arguments
  (per-epoch negative sampling lives there, so no data-loader state needs saving);
* ``collate(examples) -> dict`` of tensors;
* ``compute_loss(model, batch, dist) -> loss``. A step that back-propagates by itself (gradient caching,
  :mod:`dpr_pipeline.pretraining.objectives`) returns the loss detached; the trainer then skips ``backward``.

``micro_batch_size`` smaller than a process's share of the batch splits the share into chunks of that many examples,
each collated on its own (so each is packed or padded by itself), with the memory of one chunk: a loss over the
gathered global batch (cross-device negatives) that is a :class:`~dpr_pipeline.training.grad_cache.CachedLoss` runs
by gradient caching (the bi-encoders: the same gradient as the whole share in one pass); any other loss is
accumulated, each chunk's loss weighted by its share of the examples (the re-ranker's Eq. 4, a mean over whole
query groups: the same gradient; pre-training: the mean of equal chunks' losses, as DDP averages equal processes').
The chunk must divide the share: then the global batch, its negatives and the chunks do not depend on ``processes``.

The batch order of each epoch is a permutation seeded by (seed, epoch). A step takes ``batch_size`` examples
(over all processes: rank r gets the r-th contiguous slice). The next step's examples are read and collated in a
worker thread while the device runs this step, and on a GPU the losses are read from the device every
``LOSS_LOG_EVERY`` steps, so the host queues work ahead instead of waiting on it. Every ``save_steps`` steps the
model, optimizer, scheduler, RNG states and the step are saved to ``checkpoint_dir/latest`` (atomically, the one
before kept as ``previous``; tensors and plain containers only, loaded with ``weights_only=True``); a rerun with
the same folder continues from there and ends with the same weights as an uninterrupted run. ``checkpoint_dir`` must not
be a declared Snakemake output, since Snakemake deletes those when a job fails.

SIGTERM (what Slurm sends at a job's time limit, or ``--signal``'s time before it, and on preemption) does not
kill a training: the step in progress finishes, every process agrees on stopping there, rank 0 saves the
checkpoint of that step and :class:`TrainingStopped` ends the job with an error, so that Snakemake's retry (or
the next run) resumes from that step rather than from the last ``save_steps`` one.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import random
import shutil
import signal
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from dpr_pipeline.errors import CheckpointError, PipelineError
from dpr_pipeline.models.devices import autocast, to_device, uses_bf16
from dpr_pipeline.training.distributed import Distributed
from dpr_pipeline.training.grad_cache import CachedLoss, cached_step
from dpr_pipeline.training.stops import record_stop
from dpr_pipeline.training.schedule import (TrainingSettings, check_micro_batch, check_warmup, steps_per_epoch,
                                            total_steps)
from dpr_pipeline.training.tracking import NullTracker, Tracker, TrackingRun, open_tracker
from dpr_pipeline.stages import settings_block

log = logging.getLogger(__name__)

LOSS_LOG = "loss_log.jsonl"
CHECKPOINT_STATE = "state.pt"
#: Steps whose losses stay on an accelerator before the loop reads them, all at once, into the loss log (and the
#: progress bar): one wait for the device per this many steps instead of one per step. A checkpoint, a stop and the
#: end write the log first. On a CPU reading a loss waits for nothing: the log is written every step.
LOSS_LOG_EVERY = 25


class _LossLog:
    """The loss log's lines, written every ``every`` steps: each step's loss is kept as a device tensor (with its
    step, epoch, learning rate and the seconds when it was queued) until :meth:`write`, which also sends each step's
    loss, learning rate and examples per second to ``tracker`` (:mod:`dpr_pipeline.training.tracking`)."""

    def __init__(self, file, progress, every: int, tracker: Tracker | None = None, batch_size: int = 0):
        self.file, self.progress, self.every, self.pending = file, progress, every, []
        self.tracker, self.batch_size, self.last_seconds = tracker or NullTracker(), batch_size, 0.0

    def add(self, step: int, epoch: int, loss: torch.Tensor, learning_rate: float, seconds: float) -> None:
        self.pending.append((step, epoch, loss.detach().float(), learning_rate, seconds))
        if len(self.pending) >= self.every:
            self.write()

    def write(self) -> None:
        if not self.pending:
            return
        losses = torch.stack([loss for _, _, loss, _, _ in self.pending]).tolist()  # the one wait
        for (step, epoch, _, learning_rate, seconds), loss in zip(self.pending, losses):
            if self.file is not None:
                self.file.write(json.dumps({"step": step, "epoch": epoch, "loss": loss,
                                            "learning_rate": learning_rate, "seconds": seconds}) + "\n")
            scalars = {"train/loss": loss, "train/learning_rate": learning_rate, "train/epoch": epoch}
            elapsed, self.last_seconds = seconds - self.last_seconds, seconds
            if self.batch_size and elapsed > 0:     # the step's examples over the seconds since the step before
                scalars["train/examples_per_second"] = self.batch_size / elapsed
            self.tracker.log(scalars, step)
        if self.file is not None:
            self.file.flush()
        self.progress.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
        self.pending.clear()


class _BatchesAhead:
    """Each step's examples read and collated on the host in a worker thread while the device runs the step before
    (the collators tokenise, pad or pack: tens of milliseconds a step that the device would otherwise wait for).
    Only the order of work changes: every batch is a function of its step (seeded indices and examples)."""

    def __init__(self, make: Callable[[int], Any], first: int, last: int):
        self.make, self.last = make, last
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="batches-ahead")
        self.next = self.pool.submit(make, first) if first < last else None

    def take(self, step: int):
        """Step ``step``'s batch (raising whatever making it raised), the next one's started."""
        made = self.next.result()
        self.next = self.pool.submit(self.make, step + 1) if step + 1 < self.last else None
        return made

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class TrainingStopped(PipelineError, RuntimeError):
    """A training stopped by a signal after saving the checkpoint of the step it reached; a rerun resumes there.
    Not a bug: the job's report is this message, without a traceback (``orchestration.job_log.logged``)."""

    def __init__(self, description: str, signal_name: str, step: int, steps: int, checkpoint: Path):
        self.step = step
        super().__init__(f"{description} stopped by {signal_name} at step {step} of {steps} (the job's time limit, "
                         f"a preemption or a cancellation): checkpoint saved to {checkpoint}; the job's retry or the "
                         f"next run resumes from step {step}")


class TrainingData(Protocol):
    def __len__(self) -> int: ...

    def example(self, index: int, epoch: int) -> Any: ...


def batch_indices(num_examples: int, batch_size: int, seed: int, step: int) -> tuple[int, list[int]]:
    """(epoch, example indices) of global ``step``: a seeded permutation per epoch, cut into full batches."""
    per_epoch = steps_per_epoch(num_examples, batch_size)
    epoch, position = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(num_examples)
    size = min(batch_size, num_examples)
    return epoch, order[position * size:(position + 1) * size].tolist()


def parameter_groups(model: torch.nn.Module, settings: TrainingSettings) -> list[dict]:
    """The optimizer's parameter groups: one at ``learning_rate``, or, with ``head_learning_rate``, the task head
    of a Hugging Face model (every parameter outside ``model.base_model``: a re-ranker's freshly initialised
    classifier) at its own rate. A random head at the encoder's small rate keeps the listwise loss at chance for
    the first tens of steps, since the encoder's gradient is scaled by the head's tiny weights."""
    if settings.head_learning_rate is None:
        return [{"params": list(model.parameters())}]
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        raise ValueError(f"head_learning_rate needs a model with a task head; {type(model).__name__} has none")
    in_base = {id(p) for p in base.parameters()}
    head = [p for p in model.parameters() if id(p) not in in_base]
    return [{"params": [p for p in model.parameters() if id(p) in in_base]},
            {"params": head, "lr": settings.head_learning_rate}]


def _rng_state() -> dict:
    """The RNG states as tensors and ints only, so the checkpoint loads with ``torch.load(weights_only=True)``."""
    version, mt_state, gauss = random.getstate()
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    state = {"python": {"version": version, "state": torch.tensor(mt_state, dtype=torch.int64), "gauss": gauss},
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"].tolist()), python["gauss"]))
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["kind"], numpy_state["keys"].numpy().astype(np.uint32),
                         numpy_state["position"], numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _save_checkpoint(folder: Path, model, optimizer, scheduler, step: int, settings: TrainingSettings,
                     rank: int) -> None:
    """Write ``folder/latest`` atomically and keep the one before it as ``folder/previous``.

    The new checkpoint is written to a temporary folder first; only then does ``latest`` become ``previous``
    and the temporary folder ``latest``. A job killed at any point leaves at least one complete checkpoint, and
    a ``latest`` damaged later (a truncated copy, a full disk) falls back to ``previous`` (:func:`_load_checkpoint`).
    """
    tmp = folder / f".latest.tmp-{rank}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "step": step, "rng": _rng_state(),
                "settings": dataclasses.asdict(settings)}, tmp / CHECKPOINT_STATE)
    if (folder / LOSS_LOG).exists():
        shutil.copy(folder / LOSS_LOG, tmp / LOSS_LOG)
    latest, previous = folder / "latest", folder / "previous"
    if latest.exists():
        shutil.rmtree(previous, ignore_errors=True)
        latest.rename(previous)
    tmp.rename(latest)


_STATE_KEYS = {"model", "optimizer", "scheduler", "step", "rng", "settings"}


def _read_state(path: Path) -> dict:
    """``torch.load`` with ``weights_only=True`` (no pickled objects run); a damaged file -> CheckpointError."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises RuntimeError, UnpicklingError, EOFError, ... for damaged files
        raise CheckpointError(path, f"it cannot be read as a training checkpoint ({type(error).__name__}: "
                                    f"{str(error).strip().splitlines()[0] if str(error).strip() else error!r})") \
            from error
    if not isinstance(state, dict) or not _STATE_KEYS <= state.keys():
        raise CheckpointError(path, "it is not a training checkpoint of this pipeline (missing "
                                    f"{sorted(_STATE_KEYS - set(state)) if isinstance(state, dict) else 'all keys'})")
    return state


def _load_checkpoint(folder: Path, settings: TrainingSettings) -> dict | None:
    """The newest readable checkpoint in ``folder`` (``latest``, else ``previous``), or None if there is none.

    A checkpoint written with other settings is ignored (warning: training starts afresh). A ``latest`` that
    cannot be read falls back to ``previous`` with a warning; if no readable checkpoint is left, CheckpointError
    (never training from a damaged state or silently starting over).
    """
    candidates = [folder / name / CHECKPOINT_STATE for name in ("latest", "previous")]
    damaged: list[CheckpointError] = []
    for path in candidates:
        if not path.is_file():
            continue
        try:
            state = _read_state(path)
        except CheckpointError as error:
            log.warning("%s; trying the previous checkpoint", error)
            damaged.append(error)
            continue
        if state["settings"] != dataclasses.asdict(settings):
            log.warning("ignoring checkpoint %s: written with other settings %s", path, state["settings"])
            return None
        if damaged:
            log.warning("resuming from %s instead of the damaged %s", path, damaged[0].path)
        state["folder"] = path.parent           # its loss log is the one to continue
        return state
    if damaged:
        raise damaged[-1] if len(damaged) == 1 else CheckpointError(
            damaged[0].path, "neither it nor the previous checkpoint can be read: " + "; ".join(
                e.problem for e in damaged))
    return None


def _truncate_loss_log(path: Path, step: int) -> None:
    """Keep the loss-log lines of steps up to ``step`` (those the checkpoint includes)."""
    if not path.exists():
        return
    lines = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in lines))


def train(model: torch.nn.Module, data: TrainingData, collate: Callable[[list], dict],
          compute_loss: Callable[[torch.nn.Module, dict, Distributed], torch.Tensor], settings: TrainingSettings,
          checkpoint_dir: str | Path, *, cross_device_loss: bool = False, loss_log: str | Path | None = None,
          dist: Distributed | None = None, description: str = "training", stage: str | None = None,
          tracking: TrackingRun | dict | None = None) -> torch.nn.Module:
    """Train ``model`` in place and return it (unwrapped from DDP).

    ``cross_device_loss``: ``compute_loss`` returns the loss of the global batch, built from tensors that
    ``dist.gather`` collected from every process (cross-device negatives); its gradient is scaled so that
    DDP's averaging yields the gradient of that global loss. Otherwise the loss is the local batch's mean.
    The loss log (JSON lines: step, epoch, loss, learning_rate, seconds) is copied to ``loss_log`` at the end;
    the last step's checkpoint is saved too (a job stopped after its training loop resumes there, with nothing
    to train), and the folder stays: the job marks it finished (:func:`dpr_pipeline.training.launch.run_training`)
    and the Snakemake run removes it once the job has completed (:mod:`dpr_pipeline.orchestration.checkpoints`).
    ``description`` names the run in the log;
    ``stage`` (the job's stage) decides which settings a schedule error names (:func:`check_warmup`); ``tracking``
    (the job's `tracking` run, :mod:`dpr_pipeline.training.tracking`) also receives the loss log's scalars, from rank 0.
    """
    dist = dist or Distributed.from_environment()
    if settings.batch_size % dist.world_size or min(settings.batch_size, len(data)) < dist.world_size:
        raise ValueError(f"batch_size {settings.batch_size} ({len(data)} examples) does not split evenly over "
                         f"{dist.world_size} processes")
    share = min(settings.batch_size, len(data)) // dist.world_size
    if settings.micro_batch_size == "auto":
        raise ValueError("micro_batch_size auto: the stage chooses it for its GPU before training "
                         "(training/pass_memory.py resolve_micro_batch)")
    chunk = settings.micro_batch_size if settings.micro_batch_size and settings.micro_batch_size < share else None
    check_micro_batch(settings.batch_size, dist.world_size, settings.micro_batch_size,
                      f"stages.{settings_block(stage) or '<stage>'}.micro_batch_size")
    cached = isinstance(compute_loss, CachedLoss)
    if chunk and cross_device_loss and not cached:
        raise ValueError("micro_batch_size: a loss over the gathered global batch (cross-device negatives) cannot be "
                         "summed over micro-batches and this one declares no gradient cache (CachedLoss); use "
                         "gradient_checkpointing")
    steps = total_steps(len(data), settings)
    check_warmup(settings, steps, len(data), description, stage)
    checkpoint_dir = Path(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    device = dist.device
    optimizer, scheduler = _prepare(model, settings, device, steps)
    log_path = checkpoint_dir / LOSS_LOG
    start = _resume(checkpoint_dir, settings, model, optimizer, scheduler, dist, description, steps)
    wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if dist.enabled else model
    amp = autocast(device, settings.bf16)
    log.info("%s: %d examples, %d steps of %d, %d process(es), device %s, bf16 %s", description, len(data),
             steps, settings.batch_size, dist.world_size, device, uses_bf16(device, settings.bf16))
    began = time.monotonic()
    progress = tqdm(total=steps, initial=start, desc=description, disable=not dist.is_main, mininterval=5)

    def make_batch(step: int) -> tuple[int, list, dict | list[dict]]:
        epoch, indices = batch_indices(len(data), settings.batch_size, settings.seed, step)
        examples = [data.example(i, epoch) for i in indices[dist.rank * share:(dist.rank + 1) * share]]
        if chunk:
            return epoch, examples, [collate(examples[i:i + chunk]) for i in range(0, len(examples), chunk)]
        return epoch, examples, collate(examples)

    ahead = _BatchesAhead(make_batch, start, steps)
    tracker = open_tracker(tracking, fresh=start == 0, main=dist.is_main)
    with (open(log_path, "a", encoding="utf-8") if dist.is_main else contextlib.nullcontext() as loss_file,
          stop_signals() as received, contextlib.closing(ahead), contextlib.closing(tracker)):
        losses = _LossLog(loss_file, progress, 1 if device.type == "cpu" else LOSS_LOG_EVERY, tracker,
                          settings.batch_size)
        for step in range(start, steps):
            epoch, examples, batch = ahead.take(step)
            if chunk and cached:
                loss = cached_step(wrapped, [to_device(part, device, non_blocking=True) for part in batch],
                                   compute_loss, dist, device, amp)
            elif chunk:
                loss = _accumulate_gradients(wrapped, batch, [len(examples[i:i + chunk]) for i in
                                                              range(0, len(examples), chunk)],
                                             compute_loss, device, amp, dist)
            else:
                with amp:
                    loss = compute_loss(wrapped, to_device(batch, device, non_blocking=True), dist)
            _optimizer_step(loss * dist.world_size if cross_device_loss else loss, model, optimizer, scheduler,
                            settings.max_grad_norm)
            progress.update(1)
            losses.add(step + 1, epoch, loss, scheduler.get_last_lr()[0], round(time.monotonic() - began, 3))
            if dist.is_main and _scheduled_save(step + 1, steps, settings):
                losses.write()
                _save_checkpoint(checkpoint_dir, model, optimizer, scheduler, step + 1, settings, dist.rank)
            if dist.any_process(bool(received)):
                losses.write()
                progress.close()
                _stop(checkpoint_dir, model, optimizer, scheduler, step + 1, steps, settings, dist, description,
                      received)
        losses.write()
    progress.close()
    dist.barrier()
    if dist.is_main and loss_log is not None:
        Path(loss_log).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(log_path, loss_log)
    return model


#: The lists of the stop_signals blocks now open, innermost last, each with whether it defers (below).
_OPEN_STOPS: list[tuple[list[int], bool]] = []


class JobStopped(PipelineError, RuntimeError):
    """A training job stopped by a signal outside its training loop (loading, the dev choice, saving): nothing
    half-written is kept (atomic outputs), and the retry resumes from the training's last checkpoint."""

    def __init__(self, signal_name: str):
        super().__init__(f"the training job was stopped by {signal_name} outside its training steps (the job's "
                         "time limit, a preemption or a cancellation); its retry or the next run resumes from its "
                         "last checkpoint")


def _on_stop_signal(signum, frame) -> None:
    for received, _ in _OPEN_STOPS:
        received.append(signum)
    if not any(defers for _, defers in _OPEN_STOPS):
        raise JobStopped(signal.Signals(signum).name)


@contextlib.contextmanager
def stop_signals(*, defer: bool = True):
    """Within: SIGTERM is appended to the yielded list (and to those of the blocks around this one). With ``defer``
    (the training loop, which stops at the end of its step; a process waiting for its workers) it no longer ends
    the process; in a block where no open block defers, it raises :class:`JobStopped` at once. Outside the main
    thread, where no handler can be installed, the list stays empty."""
    received: list[int] = []
    try:
        previous = signal.signal(signal.SIGTERM, _on_stop_signal)
    except ValueError:            # not the main thread
        yield received
        return
    _OPEN_STOPS.append((received, defer))
    try:
        yield received
    finally:
        _OPEN_STOPS.pop()
        signal.signal(signal.SIGTERM, previous)


def _scheduled_save(step: int, steps: int, settings: TrainingSettings) -> bool:
    """Whether the loop checkpoints after ``step``: every ``save_steps`` steps, and the last one."""
    return step % settings.save_steps == 0 or step == steps


def _stop(checkpoint_dir: Path, model, optimizer, scheduler, step: int, steps: int, settings: TrainingSettings,
          dist: Distributed, description: str, received: list[int]) -> None:
    """A stop signal reached some process during ``step``: rank 0 saves that step's checkpoint (unless the
    ``save_steps`` schedule just did), every process waits for it, then :class:`TrainingStopped`."""
    name = signal.Signals(received[0]).name if received else "a signal to another process"
    if dist.is_main and not _scheduled_save(step, steps, settings):
        _save_checkpoint(checkpoint_dir, model, optimizer, scheduler, step, settings, dist.rank)
    if dist.is_main:
        record_stop(checkpoint_dir, step, name)
    dist.barrier()
    error = TrainingStopped(description, name, step, steps, checkpoint_dir / "latest")
    log.warning("%s", error)
    raise error


def _prepare(model: torch.nn.Module, settings: TrainingSettings, device: torch.device, steps: int):
    """Seed every generator, put the model on ``device`` in training mode, and build AdamW with the linear
    warm-up/decay schedule over ``steps``; returns (optimizer, scheduler)."""
    torch.manual_seed(settings.seed)
    random.seed(settings.seed)
    np.random.seed(settings.seed)
    model.to(device)
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    # fused AdamW (one kernel for every parameter) on CUDA, where torch has it; the default elsewhere
    optimizer = torch.optim.AdamW(parameter_groups(model, settings), lr=settings.learning_rate,
                                  weight_decay=settings.weight_decay, fused=device.type == "cuda" or None)
    return optimizer, get_linear_schedule_with_warmup(optimizer, settings.warmup(steps), steps)


def _resume(checkpoint_dir: Path, settings: TrainingSettings, model, optimizer, scheduler, dist: Distributed,
            description: str, steps: int) -> int:
    """The step to start from: the latest usable checkpoint's (model, optimizer, scheduler and RNG states
    restored, the loss log cut back to it), else 0 with a fresh loss log."""
    log_path = checkpoint_dir / LOSS_LOG
    state = _load_checkpoint(checkpoint_dir, settings)
    if state is None:
        if dist.is_main:
            log_path.unlink(missing_ok=True)
        return 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    _set_rng_state(state["rng"])
    log.info("resuming %s from checkpoint step %d of %d", description, state["step"], steps)
    if dist.is_main:
        saved_log = state["folder"] / LOSS_LOG
        if saved_log.exists():
            shutil.copy(saved_log, log_path)
        _truncate_loss_log(log_path, state["step"])
    return state["step"]


def _accumulate_gradients(model: torch.nn.Module, batches: list[dict], sizes: list[int], compute_loss: Callable,
                          device: torch.device, amp, dist: Distributed) -> torch.Tensor:
    """Backward over the collated micro-batches ``batches`` of ``sizes`` examples, each loss weighted by its share of
    the examples, so the summed gradient is the whole batch's mean-loss gradient (exact for a loss that is a mean
    over examples); DDP synchronises once, on the last. Returns the batch's mean loss, detached."""
    total = torch.zeros((), device=device)
    for index, (batch, size) in enumerate(zip(batches, sizes)):
        last = index == len(batches) - 1
        with (contextlib.nullcontext() if last or not dist.enabled else model.no_sync()):
            with amp:
                loss = compute_loss(model, to_device(batch, device), dist) * (size / sum(sizes))
            loss.backward()
        total += loss.detach()
    return total


def _optimizer_step(loss: torch.Tensor, model: torch.nn.Module, optimizer, scheduler, max_grad_norm: float) -> None:
    """Backward (when the loss has a gradient), clip to ``max_grad_norm`` (0: no clipping), step, zero."""
    if loss.requires_grad:
        loss.backward()
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)

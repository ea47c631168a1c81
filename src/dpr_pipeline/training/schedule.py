"""A training run's settings and its schedule: how many optimizer steps it takes (epochs, a step budget or a floor),
how many epochs of negative draws it reaches, and the warm-up check; no torch, so that Snakemake's planning reads
them (the teacher's draws) without loading it."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.stages import settings_block

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingSettings:
    """The training loop's settings: a default is its key's default in the schema's `training` fragment (the blocks
    `retriever`, `reranker` and `distill` build on), a key whose blocks default it differently has none
    (``tests/test_training_settings.py``)."""

    learning_rate: float
    warmup_steps: int
    batch_size: int
    epochs: float  # passes over the examples (unless train_steps is set)
    train_steps: int | None = None  # a fixed step budget instead of epochs
    min_steps: int = 40  # the fewest steps a run sized in epochs takes (more epochs on a small collection)
    seed: int = 42
    save_steps: int = 500
    gradient_checkpointing: bool = False
    bf16: bool = True  # bf16 autocast where the device runs it natively (devices.uses_bf16)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    head_learning_rate: float | None = None  # the task head's (parameters outside the base model), if not learning_rate
    warmup_ratio: float | None = None  # warm-up as a fraction of the run; replaces warmup_steps when set
    # examples per process per forward pass (gradient cache or accumulation); "auto": chosen by the stage for its GPU
    # (training/pass_memory.py) before the loop starts
    micro_batch_size: int | str | None = None

    def warmup(self, steps: int) -> int:
        """Warm-up steps of a run of ``steps``: ``warmup_ratio`` of it when set, else ``warmup_steps``."""
        return round(self.warmup_ratio * steps) if self.warmup_ratio is not None else self.warmup_steps


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    """Full batches per epoch (the last partial batch is dropped), at least one."""
    return max(1, num_examples // batch_size)


def epoch_steps(num_examples: int, settings: TrainingSettings) -> int:
    """The optimizer steps ``epochs`` passes over ``num_examples`` take (at least one)."""
    return max(1, math.ceil(settings.epochs * steps_per_epoch(num_examples, settings.batch_size)))


def total_steps(num_examples: int, settings: TrainingSettings) -> int:
    """The run's optimizer steps: ``train_steps`` when set, else its epochs' steps but at least ``min_steps``
    (a few hundred queries in batches of 32 make 5 steps an epoch: the floor trains them more epochs)."""
    if settings.train_steps is not None:
        return settings.train_steps
    return max(settings.min_steps, epoch_steps(num_examples, settings))


#: The settings that decide a run's steps (:func:`total_steps`), all :func:`epochs_visited` needs.
STEP_KEYS = ("batch_size", "epochs", "train_steps", "min_steps")


def epochs_visited(num_examples: int, *, batch_size: int, epochs: float, min_steps: int,
                   train_steps: int | None = None) -> int:
    """How many epochs (each with its own negative draws) a run of ``num_examples`` reaches, its steps set by
    :data:`STEP_KEYS` (``train_steps`` None: sized by ``epochs``)."""
    settings = TrainingSettings(learning_rate=0.0, warmup_steps=0, batch_size=batch_size, epochs=epochs,
                                train_steps=train_steps, min_steps=min_steps)  # the schedule plays no part
    return math.ceil(total_steps(num_examples, settings) / steps_per_epoch(num_examples, settings.batch_size))


#: Fewer optimizer steps than this: a stage that barely trains, said in the job's log.
FEW_STEPS = 20


def check_warmup(settings: TrainingSettings, steps: int, num_examples: int, description: str = "training",
                 stage: str | None = None) -> None:
    """A warm-up longer than half the run spends most of it below the peak learning rate (the bundled 10 steps
    of a 150-query collection in batches of 16: 9 steps, all inside it): a ConfigError naming the stage's
    setting, the step count and what made it, before any training. A run of fewer than :data:`FEW_STEPS`
    steps is logged as a warning, and one that ``min_steps`` lengthened as what lengthened it. ``stage``: the
    job's stage, whose declared block (:func:`dpr_pipeline.stages.settings_block`) the messages name."""
    stage = settings_block(stage) or "<stage>"
    made_of = (f"train_steps {settings.train_steps}" if settings.train_steps is not None else
               f"{num_examples} training examples in batches of {settings.batch_size}, {settings.epochs:g} epoch(s)")
    if settings.train_steps is None and steps > epoch_steps(num_examples, settings):
        made_of = (f"stages.{stage}.min_steps {settings.min_steps}: {settings.epochs:g} epoch(s) of {num_examples} "
                   f"training examples in batches of {settings.batch_size} make only "
                   f"{epoch_steps(num_examples, settings)}")
        log.info("%s: %d optimizer steps (%s; %.1f epochs)", description, steps, made_of,
                 steps / steps_per_epoch(num_examples, settings.batch_size))
    if steps < FEW_STEPS:
        log.warning("%s: only %d optimizer step(s) (%s); raise stages.%s.epochs or train_steps to train more",
                    description, steps, made_of, stage)
    warmup = settings.warmup(steps)
    if 2 * warmup <= steps:
        return
    raise ConfigError(f"{description}: stages.{stage}.warmup_steps {settings.warmup_steps} is more than half of the "
                      f"{steps} training step(s) of this run ({made_of}), so most of the run would train below the "
                      f"peak learning rate {settings.learning_rate:g}. Fix: set the dataset's "
                      f"stages.{stage}.warmup_ratio (e.g. 0.1, a tenth of any run) or warmup_steps at most "
                      f"{steps // 2}, or train longer (epochs or train_steps)")


def check_micro_batch(batch_size: int, processes: int, micro_batch_size: int | str | None, setting: str) -> None:
    """``micro_batch_size`` must divide a process's share of ``batch_size`` (``batch_size / processes``), so that
    the chunks, like the global batch and its negatives, are the same whatever ``processes`` is: else a ConfigError
    naming ``setting`` (where it is set) and a value that would do. ``auto`` (the stage chooses a divisor for its
    GPU: :mod:`dpr_pipeline.training.pass_memory`) passes."""
    if not micro_batch_size or micro_batch_size == "auto" or batch_size % processes or (batch_size // processes) % micro_batch_size == 0:
        return
    share = batch_size // processes
    fits = max(d for d in range(1, min(share, micro_batch_size) + 1) if share % d == 0)
    raise ConfigError(f"{setting}: {micro_batch_size} does not divide a process's share of the batch (batch_size "
                      f"{batch_size} / {processes} processes = {share} examples), so the chunks would not all be "
                      f"{micro_batch_size} examples and the step would depend on `processes`. Fix: set "
                      f"micro_batch_size to a divisor of {share} (e.g. {fits}), or null for the whole share in one "
                      "pass")

"""A job's settings, typed: the frozen dataclass every job kind's settings class extends (the training jobs':
:mod:`dpr_pipeline.training.settings`; the corpus encoding, search, scoring and mining jobs':
:mod:`dpr_pipeline.retrieval.settings`, :mod:`dpr_pipeline.reranking.settings`; the pre-training's inputs':
:mod:`dpr_pipeline.pretraining.settings`; the starting model's: :mod:`dpr_pipeline.models.settings`); no torch.

The class's fields pick a job's params from the config (:meth:`JobSettings.pick`, in
:mod:`dpr_pipeline.orchestration.stage_settings`): that plain dict is what Snakemake compares to rerun a job. The
job's adapter (``workflow_scripts/``) builds the object from it once (:meth:`JobSettings.from_params`) and hands
it on typed. ``from_params`` is strict: a key the class does not declare, or a required one missing, is a
ConfigError naming the stage, the key and the fix.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import ClassVar, Self

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.stages import settings_block

PART = "part"


def part(of: type):
    """A field holding a group of the job's keys as a dataclass of its own (``of``), built from the same dict."""
    return field(metadata={PART: of})


@dataclass(frozen=True, kw_only=True)
class JobSettings:
    """What every job's settings class shares: the keys its fields read (:meth:`keys`, :meth:`pick`), the strict
    :meth:`from_params` and its inverse :meth:`as_params`."""

    #: The config block the messages name when the job's stage is not known (a job run by hand).
    BLOCK: ClassVar[str]

    @classmethod
    def keys(cls) -> dict[str, Field]:
        """Every params key the class reads: its own fields' and its parts' fields', each with its field."""
        keys = {}
        for own in fields(cls):
            keys.update({f.name: f for f in fields(own.metadata[PART])} if PART in own.metadata else {own.name: own})
        return keys

    @classmethod
    def pick(cls, values: dict) -> dict:
        """A job's params from the settings ``values`` it may read: those of the keys the class reads, in the
        class's order (the other values are other jobs')."""
        return {key: values[key] for key in cls.keys() if key in values}

    def as_params(self) -> dict:
        """The settings as params again (every field, its parts' flattened): ``from_params`` of it is an equal
        object."""
        params = {}
        for own in fields(self):
            value = getattr(self, own.name)
            params.update(asdict(value) if PART in own.metadata else {own.name: value})
        return params

    @classmethod
    def from_params(cls, params: dict, stage: str | None = None) -> Self:
        """The settings of a job of ``stage`` (``retriever1``, ``pretrain/simlm``; None: by hand) from its params:
        every key one the class declares, every required one present."""
        block = settings_block(stage) or cls.BLOCK
        keys = cls.keys()
        unknown = sorted(set(params) - set(keys))
        if unknown:
            raise ConfigError(
                f"stages.{block}: the {stage or block} job's params carry {', '.join(unknown)}, which "
                f"{cls.__name__} does not declare, so no code of the job reads it. Fix: declare it as a field of "
                f"{cls.__module__}.{cls.__name__} where the job reads it, or keep it out of the job's params "
                "(dpr_pipeline.orchestration.stage_settings)")
        missing = [key for key, f in keys.items()
                   if key not in params and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise ConfigError(
                f"stages.{block}: the {stage or block} job's params lack {', '.join(missing)}, which {cls.__name__} "
                f"requires. Fix: hand the job these keys of stages.{block} (dpr_pipeline.orchestration."
                "stage_settings gives each job its block's values; params written by hand must carry them too)")
        values = {}
        for own in fields(cls):
            if PART in own.metadata:
                of = own.metadata[PART]
                values[own.name] = of(**{f.name: params[f.name] for f in fields(of) if f.name in params})
            elif own.name in params:
                values[own.name] = params[own.name]
        return cls(**values)

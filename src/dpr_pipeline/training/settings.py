"""A training job's settings, typed: one frozen dataclass per kind of training stage (as Tevatron's dataclass
arguments), each declaring the rule that trains its stages (``trainer``: :func:`settings_class`); no torch.

The class's fields pick a job's params from its config block (:meth:`StageSettings.pick`, in
:mod:`dpr_pipeline.orchestration.stage_settings`): that plain dict is what Snakemake compares to rerun a job. The
job's adapter builds the object from it once (:meth:`StageSettings.from_params`) and hands it to the training
function; torchrun workers receive it as JSON (:meth:`StageSettings.as_params`) and build it again.
``from_params`` is strict: a key the class does not declare, or a required one missing, is a ConfigError naming
the stage, the key and the fix. A field's default is its key's schema default (``schemas/config.schema.yaml``,
``tests/test_training_settings.py``); a field without one (``plm``, a count the blocks sharing the class default
differently) is required. The optimisation settings are one part,
:class:`~dpr_pipeline.training.schedule.TrainingSettings` (the object the loop and its checkpoints take).
"""

from __future__ import annotations

from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import ClassVar, Self

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.stages import settings_block
from dpr_pipeline.stages import stage as declared
from dpr_pipeline.training.schedule import TrainingSettings

PART = "part"


def part(of: type):
    """A field holding a group of the job's keys as a dataclass of its own (``of``), built from the same dict."""
    return field(metadata={PART: of})


@dataclass(frozen=True, kw_only=True)
class StageSettings:
    """What every training job's settings class shares: the keys its fields pick, the strict :meth:`from_params`
    and its inverse :meth:`as_params`. A subclass names the rule that trains its stages: ``class
    BiEncoderSettings(StageSettings, trainer="train_retriever")`` (:func:`settings_class`)."""

    #: The config block the messages name when the job's stage is not known (a training run by hand).
    BLOCK: ClassVar[str]
    #: The rule that trains the class's stages (declared in its class statement).
    TRAINER: ClassVar[str]
    #: The settings class of each training rule, as each class declares it.
    OF_TRAINER: ClassVar[dict[str, type[StageSettings]]] = {}

    def __init_subclass__(cls, trainer: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if trainer is not None:
            cls.TRAINER = trainer
            StageSettings.OF_TRAINER[trainer] = cls

    @classmethod
    def keys(cls) -> dict[str, Field]:
        """Every params key the class reads: its own fields' and its parts' fields', each with its field."""
        keys = {}
        for own in fields(cls):
            keys.update({f.name: f for f in fields(own.metadata[PART])} if PART in own.metadata else {own.name: own})
        return keys

    @classmethod
    def pick(cls, block: dict) -> dict:
        """A job's params from its merged config ``block``: the values of the keys the class reads (the block's
        other keys are other jobs')."""
        keys = cls.keys()
        return {key: value for key, value in block.items() if key in keys}

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


def settings_class(stage: str) -> type[StageSettings]:
    """The settings class of a training ``stage``'s jobs: the one its declared ``trainer`` rule's class names
    (the class's module imported: :mod:`dpr_pipeline.pretraining.settings` for ``pretrain/{method}``)."""
    return StageSettings.OF_TRAINER[declared(stage).trainer]


@dataclass(frozen=True, kw_only=True)
class BiEncoderSettings(StageSettings, trainer="train_retriever"):
    """A bi-encoder's training job (`retriever`, `retriever1`/`retriever2` over it, the ablation's rows; SimLM
    Eq. 3), but the corpus encoding, index and search settings its other jobs read."""

    BLOCK: ClassVar[str] = "retriever"
    training: TrainingSettings = part(TrainingSettings)
    plm: str  # the model it starts from, as loaded (a folder: stage_settings.initialisation)
    negatives_per_query: int  # hard negatives drawn per query and epoch
    temperature: float = 0.02  # τ of the contrastive loss (cos / τ)
    query_max_length: int = 32  # tokens per query, in training and dev selection (the saved model records it)
    passage_max_length: int = 144  # tokens per passage
    pooling: str = "auto"  # auto (the plm's own), cls or mean
    query_prompt: str | None = None  # text before every query; None (not in the params): the plm's own
    passage_prompt: str | None = None  # text before every passage; None (not in the params): the plm's own
    attention_dropout: float | None = None  # training only: the attention dropout (None keeps the plm's)
    processes: int = 1  # the job's processes: its GPUs (resources), in the params so that a change reruns it
    nodes: int = 1  # the nodes they spread over (resources), in the params as processes is


@dataclass(frozen=True, kw_only=True)
class DistillSettings(BiEncoderSettings, trainer="train_distill"):
    """The distilled retriever's training job (`distill`; SimLM Eq. 5): a bi-encoder's, and the weight α."""

    BLOCK: ClassVar[str] = "distill"
    alpha: float = 0.2  # weight of the contrastive loss beside the KL to the teacher


@dataclass(frozen=True, kw_only=True)
class RerankerSettings(StageSettings, trainer="train_reranker"):
    """The cross-encoder re-ranker's training job (`reranker`; SimLM Eq. 4), but the settings of its scoring
    jobs and of the fusion."""

    BLOCK: ClassVar[str] = "reranker"
    training: TrainingSettings = part(TrainingSettings)
    plm: str  # the cross-encoder's start, as loaded
    negatives_per_query: int  # hard negatives per query and epoch, each group 1 positive + these
    max_length: int = 192  # tokens per query-passage pair (the saved model records it)
    attention_dropout: float | None = None  # training only: the attention dropout (None keeps the plm's)
    processes: int = 1  # the job's processes: its GPUs (resources), in the params so that a change reruns it
    nodes: int = 1  # the nodes they spread over (resources), in the params as processes is

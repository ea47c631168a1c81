"""A training job's settings, typed: one frozen dataclass per kind of training stage (as Tevatron's dataclass
arguments, a :class:`~dpr_pipeline.job_settings.JobSettings`; the stage registry names each training rule's,
:data:`dpr_pipeline.stages.TRAINERS`), and the bi-encoders' dev selection's; no torch.

The adapter builds the object from the job's params once and hands it to the training function; torchrun workers
receive it as JSON (:meth:`~dpr_pipeline.job_settings.JobSettings.as_params`, with the job's stage:
:mod:`dpr_pipeline.training.launch`) and build it again. A field's default is its key's schema default
(``schemas/config.schema.yaml``, ``tests/test_training_settings.py``); a field without one (``plm``, a count the
blocks sharing the class default differently) is required. The optimisation settings are one part,
:class:`~dpr_pipeline.training.schedule.TrainingSettings` (the object the loop and its checkpoints take).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from dpr_pipeline.job_settings import JobSettings, part
from dpr_pipeline.training.schedule import TrainingSettings


@dataclass(frozen=True, kw_only=True)
class StageSettings(JobSettings):
    """What every training job's settings class shares (the registry names each training rule's:
    :data:`dpr_pipeline.stages.TRAINERS`)."""

    @classmethod
    def pick(cls, block: dict) -> dict:
        """A training job's params from its merged config ``block``: the values of the keys the class reads, in
        the block's order (the order its params have always had: Snakemake records them as written, and another
        order would rerun every training)."""
        keys = cls.keys()
        return {key: value for key, value in block.items() if key in keys}


@dataclass(frozen=True, kw_only=True)
class BiEncoderSettings(StageSettings):
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
class DistillSettings(BiEncoderSettings):
    """The distilled retriever's training job (`distill`; SimLM Eq. 5): a bi-encoder's, the weight α and the
    teacher's temperature."""

    BLOCK: ClassVar[str] = "distill"
    alpha: float = 0.2  # weight of the contrastive loss beside the KL to the teacher
    teacher_temperature: float = 1.0  # T of the teacher's softmax(θ / T) in the KL


@dataclass(frozen=True, kw_only=True)
class RerankerSettings(StageSettings):
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


@dataclass(frozen=True, kw_only=True)
class DevSelectionSettings(JobSettings):
    """How a trained bi-encoder stage chooses on the dev split between its trained model and its start
    (`selection`, :mod:`dpr_pipeline.training.dev_selection`), as
    :func:`dpr_pipeline.orchestration.stage_settings.selection` resolves it for the stage's job: its ``metric``
    from the block, the rest from the dataset, the stage and the corpus search."""

    BLOCK: ClassVar[str] = "selection"
    split: str | None  # the dataset's dev split; None: the trained model goes on unchecked, for ``reason``
    reason: str | None  # why the trained model goes on unchecked; None where it is checked
    metric: str  # what the candidates are scored in (`selection.metric`)
    depth: int  # hits per dev query, as the stage's dev search
    relevance_level: int  # the dev split's lowest relevant grade
    encode_batch_size: int  # the corpus encoding's batch size
    embedding_dtype: str  # the corpus vectors' dtype, as the corpus encoding stores them
    ignore_identical_ids: bool  # a hit with the query's own id is dropped, as the evaluation drops it
    label: str  # the stage's summary label
    start_label: str  # its start's label (a model outside the chain: its reference)
    start_stage: str | None  # the chain stage whose model it starts from, whose dev run scores the start; None
    teacher_stage: str | None = None  # a student's teacher, above its start on dev or not trained (None: no teacher)
    teacher_label: str | None = None  # the teacher's label


@dataclass(frozen=True, kw_only=True)
class DevFiles:
    """The files a dev selection reads (the training job's inputs, rules/inputs.smk ``selection_inputs``): the dev
    split's ``queries`` and ``qrels``; the start's dev run (``start_run``) where the start is a chain stage; a
    student's teacher's and start's metrics (``teacher_metrics``, ``start_metrics``). None: not an input of the
    job."""

    queries: str | None = None
    qrels: str | None = None
    start_run: str | None = None
    teacher_metrics: str | None = None
    start_metrics: str | None = None


@dataclass(frozen=True)
class DevSelection:
    """A bi-encoder training job's dev selection: its settings, its files and where its record goes (``output``,
    the job's dev_selection.json); :meth:`as_dict` and :meth:`from_dict` carry it to torchrun's workers."""

    settings: DevSelectionSettings
    files: DevFiles
    output: str

    def as_dict(self) -> dict:
        return {"settings": self.settings.as_params(), "files": asdict(self.files), "output": self.output}

    @classmethod
    def from_dict(cls, values: dict) -> DevSelection:
        return cls(DevSelectionSettings.from_params(values["settings"]), DevFiles(**values["files"]),
                   values["output"])

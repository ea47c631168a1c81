"""A pre-training job's settings, typed (:class:`PretrainSettings`, the `pretrain` block as a ``pretrain/{method}``
job gets it), built strictly from its params as every training job's are
(:meth:`dpr_pipeline.job_settings.JobSettings.from_params`), and its input jobs' (tokenisation, n-gram counts); no
torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dpr_pipeline.pretraining.methods import ObjectiveSettings
from dpr_pipeline.training.schedule import TrainingSettings
from dpr_pipeline.job_settings import JobSettings, part
from dpr_pipeline.training.settings import StageSettings


@dataclass(frozen=True)
class PretrainingLoopSettings(TrainingSettings):
    """The training loop's settings as the `pretrain` block gives them: its own defaults where they differ from the
    `training` fragment's, and a run sized by ``train_steps`` (the block has no ``epochs``)."""

    epochs: float = 1.0  # unread: train_steps sizes the run
    train_steps: int | None = 80000
    save_steps: int = 1000


@dataclass(frozen=True, kw_only=True)
class GeneratorSettings:
    """The generator of the methods that have one (simlm, enc_dec_rtd; train.build_generator)."""

    generator: str = "google/electra-base-generator"  # a masked-LM model reference, or `random`
    train_generator: bool = False  # train a pre-trained generator jointly (MLM)
    random_generator_hidden_size: int = 256  # `generator: random`: its width
    random_generator_layers: int = 12  # `generator: random`: its depth


@dataclass(frozen=True, kw_only=True)
class PretrainSettings(StageSettings):
    """A ``pretrain/{method}`` job: the method's settings (:class:`ObjectiveSettings`, ``method`` the job's own,
    ``bottleneck`` as configured: ``auto`` resolved by the trainer), the generator's, the loop's, and these."""

    BLOCK: ClassVar[str] = "pretrain"
    training: PretrainingLoopSettings = part(PretrainingLoopSettings)
    objective: ObjectiveSettings = part(ObjectiveSettings)
    token_generator: GeneratorSettings = part(GeneratorSettings)
    plm: str  # the encoder it starts from, as loaded
    max_length: int = 144  # tokens per passage: the token shards' (their job reads it; the saved model records theirs)
    cdmae_window: int = 4  # CDMAE's AMI window L (the n-gram counts' job reads it too)
    compile: bool = False  # torch.compile each Transformer layer
    attention_dropout: float | None = None  # the attention dropout (None keeps the plm's)
    processes: int = 1  # the job's processes: its GPUs (resources), in the params so that a change reruns it
    nodes: int = 1  # the nodes they spread over (resources), in the params as processes is


@dataclass(frozen=True, kw_only=True)
class TokenizeCorpusSettings(JobSettings):
    """A tokenisation job (`tokenize_corpus`): the plm (its tokenizer), the shards and the length."""

    BLOCK: ClassVar[str] = "pretrain"
    plm: str
    tokenize_shards: int
    max_length: int


@dataclass(frozen=True, kw_only=True)
class NgramCountSettings(JobSettings):
    """The n-gram counting job (`count_ngrams`): the plm (its tokenizer) and CDMAE's window."""

    BLOCK: ClassVar[str] = "pretrain"
    plm: str
    cdmae_window: int

"""The workflow's stages, each declared once: its summary label, its kind (what its model is and which rules run
it), the config block holding its settings (the trainer's settings key), the rule that trains it, the stage it is
read against, what feeds it (whose hard negatives it trains on, whose runs a re-ranker re-ranks, its teacher),
what its model may start from, its loss curve's title and what its model card calls it and its negatives.

Everything else asks this module instead of listing stage names: the stage lists of ``rules/common.smk``
(``STAGES``, ``BIENCODERS``, ``TRAINED_STAGES``, …), the rules' inputs (which negatives train a stage, which run the
re-ranker re-ranks, which stages are mined), the summary's labels, a bi-encoder's config block, the loss curves'
and score distributions' titles (:mod:`dpr_pipeline.report.plots`), the model card's prose
(:mod:`dpr_pipeline.orchestration.card`),
the settings a training error names (:mod:`dpr_pipeline.training.launch`, :mod:`dpr_pipeline.training.trainer`),
the rules that ask for GPUs (:mod:`dpr_pipeline.orchestration.resources`) and the conda environment of the rules that run
PyTorch
(``envs/torch-gpu.yaml`` for a GPU rule, ``envs/torch.yaml`` otherwise). A family member's name
(``ablation/simlm``) is built and read here only (:func:`member`, :func:`family_member`). ``tests/test_stages.py``
checks that the parsed workflow and the Slurm profile agree with it (a GPU rule never runs in the CPU environment),
and declares a stage of its own to check that the plan and the report take it up.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """What a stage's model is, and the rules other than its trainer that run that model on a GPU (one each)."""

    name: str
    gpu_rules: tuple[str, ...] = ()


LEXICAL = Kind("lexical")                                                 # BM25: Lucene, on CPUs
PRETRAINED_ENCODER = Kind("pre-trained encoder")                          # a start for the bi-encoders, not scored
BIENCODER = Kind("bi-encoder", ("encode_corpus", "dense_search"))
# denoise_scores: a cross-encoder's scores of a mined stage's pool (mining.<stage>.denoise), on one GPU
CROSS_ENCODER = Kind("cross-encoder", ("rerank", "teacher_scores_shard", "denoise_scores"))


@dataclass(frozen=True)
class Stage:
    """One stage: its outputs live under ``results/{dataset}/{name}/``.

    ``block``: the config block of its settings (``stages.<block>``), the key its training errors name;
    ``shares``: the block whose settings its own block overrides (Retriever₁'s ``stages.retriever1`` over the
    bi-encoders' ``stages.retriever``; None: its block is all its settings);
    ``trainer``: the rule that trains it, on the stage's ``processes`` GPUs (None: not trained); ``below``: the
    stage it improves on in the chain (SimLM Table 6), the one a seed spread reads it against; ``label``: its row
    in the summaries (None for a family, whose members are named by pre-training method).

    What feeds it: ``fed_by``, the stage whose train-split run is mined for the hard negatives it trains on
    (``results/{dataset}/<fed_by>/negatives.parquet``, ``mining.<fed_by>``; so that stage is *mined*), and for a
    cross-encoder also the stage whose runs it re-ranks; ``teacher``: the cross-encoder whose scores of those
    negatives it distils (it trains on ``<teacher>/teacher_scores.parquet``). ``starts_from``: the trained stages
    whose model its block's ``plm`` may name (``distill.plm: retriever2``).

    Its words: ``loss``, the title of its loss curve (what its loss_log.jsonl measures; a family's has
    ``{method}``); ``prose``, how a sentence names it (its label when None); ``card_name``, what its model card
    calls it (its prose when None; a family's has ``{stage}``); ``card_negatives``, what the card says it trained
    on (None: "its training negatives")."""

    name: str
    label: str | None
    kind: Kind
    block: str
    shares: str | None = None
    trainer: str | None = None
    below: str | None = None
    fed_by: str | None = None
    teacher: str | None = None
    starts_from: tuple[str, ...] = ()
    loss: str | None = None
    prose: str | None = None
    card_name: str | None = None
    card_negatives: str | None = None

    @property
    def trains(self) -> bool:
        return self.trainer is not None


#: The main chain in pipeline order (SimLM Figure 2): each writes results/{dataset}/{stage}/run_{split}.trec and
#: is a row of the summary. `start` is the bi-encoders' starting model, untrained.
CHAIN = (
    Stage("bm25", "BM25", LEXICAL, "bm25"),
    Stage("start", "Starting model (untrained)", BIENCODER, "retriever", prose="the starting model (untrained)"),
    Stage("retriever1", "Retriever₁", BIENCODER, "retriever1", "retriever", trainer="train_retriever", below="start",
          fed_by="bm25", loss="Retriever₁ (BM25 negatives): contrastive loss, Eq. 3",
          card_negatives="BM25's hard negatives"),
    Stage("retriever2", "Retriever₂", BIENCODER, "retriever2", "retriever", trainer="train_retriever",
          below="retriever1", fed_by="retriever1", starts_from=("retriever1",), loss="Retriever₂ (Retriever₁'s mined negatives): contrastive loss, Eq. 3",
          card_negatives="Retriever₁'s mined hard negatives (`mining.retriever1`)"),
    Stage("reranker", "Re-ranker", CROSS_ENCODER, "reranker", trainer="train_reranker", below="retriever2",
          fed_by="retriever2", loss="Re-ranker (Retriever₂'s mined negatives): cross-encoder loss, Eq. 4",
          prose="the re-ranker", card_name="the cross-encoder re-ranker",
          card_negatives="Retriever₂'s mined hard negatives (`mining.retriever2`)"),
    Stage("distill", "Retriever_distill", BIENCODER, "distill", trainer="train_distill", below="retriever2",
          fed_by="retriever2", teacher="reranker", starts_from=("retriever1", "retriever2"),
          loss="Retriever_distill: KL to the teacher + α · contrastive, Eq. 5", prose="the distilled retriever",
          card_negatives="Retriever₂'s mined hard negatives scored by the re-ranker (its teacher scores), "
                         "distilled with SimLM's Eq. 5 (KL to the teacher plus the contrastive loss)"),
)

#: Families of stages named ``<family>/<method>`` (:func:`member`), one member per pre-training method: the
#: pre-trained encoders, and SimLM Table 7's ablation (Retriever₁ fine-tuned from each encoder, ``none``: from the
#: untrained plm, on Retriever₁'s negatives).
PRETRAINING = Stage("pretrain", None, PRETRAINED_ENCODER, "pretrain", trainer="pretrain",
                    loss="Pre-training ({method}): its pre-training objective")
ABLATION = Stage("ablation", None, BIENCODER, "retriever", trainer="train_retriever", fed_by="bm25",
                 loss="Ablation Retriever₁ from {method}: contrastive loss, Eq. 3",
                 card_name="Retriever₁ of the pre-training ablation (`{stage}`)",
                 card_negatives="BM25's hard negatives")
FAMILIES = (PRETRAINING, ABLATION)

#: The conda environments of the rules that run PyTorch (relative to the repository root): a GPU rule's has CUDA
#: torch and faiss-gpu, the other's faiss-cpu.
GPU_ENV = "envs/torch-gpu.yaml"
CPU_TORCH_ENV = "envs/torch.yaml"


def member(family: Stage, method: str) -> str:
    """The name of ``family``'s member for pre-training ``method`` (``ablation/simlm``; ``{method}`` for a rule's
    pattern): the folder ``results/{dataset}/<family>/<method>/``."""
    return f"{family.name}/{method}"


def members(family: Stage, methods) -> list[str]:
    """The names of ``family``'s members for ``methods``, in their order."""
    return [member(family, method) for method in methods]


def family_member(name: str) -> tuple[Stage, str] | None:
    """``(family, method)`` of a family member's name (``ablation/simlm``), None for any other name."""
    family, _, method = name.partition("/")
    if not method or "/" in method:
        return None
    return next(((declared, method) for declared in FAMILIES if declared.name == family), None)


def settings_block(name: str | None) -> str | None:
    """The config block of stage ``name``'s settings (``stages.<block>``: what its training errors name); None for
    a name that is no declared stage (a training run by hand or by a test)."""
    try:
        return stage(name).block if name is not None else None
    except KeyError:
        return None


def stage(name: str) -> Stage:
    """The declaration of stage ``name``: a chain stage, or a family member (``ablation/simlm``)."""
    for declared in CHAIN:
        if declared.name == name:
            return declared
    found = family_member(name)
    if found is not None:
        return found[0]
    raise KeyError(f"stage {name!r} is not declared: one of {[s.name for s in CHAIN]} or "
                   f"{[f.name + '/<method>' for f in FAMILIES]} (src/dpr_pipeline/stages.py)")


def chain(kind: Kind | None = None) -> list[str]:
    """The chain's stage names in pipeline order, those of one ``kind`` if given."""
    return [s.name for s in CHAIN if kind is None or s.kind == kind]


def trained() -> list[str]:
    """The chain's trained stages (each writes a loss_log.jsonl), in pipeline order."""
    return [s.name for s in CHAIN if s.trains]


def trained_by(rule: str) -> list[str]:
    """The chain's stages that ``rule`` trains, in pipeline order."""
    return [s.name for s in CHAIN if s.trainer == rule]


def trained_with(block: str) -> list[str]:
    """The chain's trained stages whose settings are config block ``block`` (or override it), in pipeline order."""
    return [s.name for s in CHAIN if s.trains and block in (s.block, s.shares)]


def shared_block(block: str) -> str | None:
    """The block that a stage's own block ``block`` overrides (``retriever`` for ``retriever2``), else None."""
    return next((s.shares for s in CHAIN if s.block == block and s.shares), None)


def overriding_blocks() -> list[str]:
    """The stages' own blocks that override a shared one (``retriever1``, ``retriever2``), in pipeline order."""
    return [s.block for s in CHAIN if s.shares]


def mined(kind: Kind | None = None) -> list[str]:
    """The chain's mined stages, those of one ``kind`` if given, in pipeline order: each writes
    ``negatives.parquet`` from its train-split run (config ``mining.<stage>``), as a stage's ``fed_by``."""
    feeding = {s.fed_by for s in CHAIN + FAMILIES}
    return [s.name for s in CHAIN if s.name in feeding and (kind is None or s.kind == kind)]


def reads_mined(name: str, mined_stage: str) -> bool:
    """Whether the model of stage ``name`` depends on ``mined_stage``'s mined negatives: it trains on them (its
    ``fed_by``), or a stage it trains on, distils or starts from does (``fed_by``, ``teacher``, ``starts_from``,
    followed back). Such a model cannot denoise that mining (``mining.<stage>.denoise.model``): a cycle."""
    declared = stage(name)
    if declared.fed_by == mined_stage:
        return True
    return any(reads_mined(earlier, mined_stage)
               for earlier in (declared.fed_by, declared.teacher, *declared.starts_from) if earlier is not None)


def denoisers() -> list[str]:
    """The chain's trained cross-encoders, which ``mining.<stage>.denoise.model`` may name (for the stages mined
    without them: :func:`reads_mined`)."""
    return [s.name for s in CHAIN if s.kind == CROSS_ENCODER and s.trains]


def fed_by(name: str) -> list[str]:
    """The chain stages that train on stage ``name``'s mined negatives themselves (not through a teacher)."""
    return [s.name for s in CHAIN if s.fed_by == name and s.teacher is None]


def teacher() -> str:
    """The cross-encoder whose scores of its own training negatives a chain stage distils (its teacher scores)."""
    return next(s.teacher for s in CHAIN if s.teacher is not None)


def starting_stage() -> str:
    """The bi-encoders' starting model: the chain's bi-encoder that is not trained (a trained bi-encoder's dev
    selection and the summary's verdict read against it)."""
    return next(s.name for s in CHAIN if s.kind == BIENCODER and not s.trains)


def blocks(kind: Kind) -> list[str]:
    """The config blocks of the chain's stages of ``kind``, each once, in pipeline order."""
    return list(dict.fromkeys(s.block for s in CHAIN if s.kind == kind))


def starts_named_by(block: str) -> tuple[str, ...]:
    """The trained stages whose model config ``<block>.plm`` may name (the ``starts_from`` of its stages)."""
    return tuple(dict.fromkeys(start for s in CHAIN if s.block == block for start in s.starts_from))


def prose(name: str) -> str:
    """How a sentence names chain stage ``name``: its ``prose``, else its label."""
    declared = stage(name)
    return declared.prose or declared.label


def training_loss(name: str) -> str:
    """The title of a trained stage's loss curve (``retriever1``, ``pretrain/simlm``, ``ablation/none``): its
    declared ``loss``, else its label's training loss (never a KeyError for a stage that declares none)."""
    declared, found = stage(name), family_member(name)
    if declared.loss is None:
        return f"{declared.label or name}: training loss"
    return declared.loss.format(method=found[1]) if found else declared.loss


def card_name(name: str) -> str:
    """What the model card of stage ``name`` calls it."""
    declared = stage(name)
    return (declared.card_name or declared.prose or declared.label).format(stage=name)


def card_negatives(name: str) -> str:
    """What the model card of stage ``name`` says it trained on."""
    return stage(name).card_negatives or "its training negatives"


#: The summaries' row label of each chain stage.
STAGE_LABELS = {s.name: s.label for s in CHAIN}
#: The stage each one is read against: the one it improves on in the chain (SimLM Table 6).
STAGE_BELOW = {s.name: s.below for s in CHAIN if s.below is not None}

@dataclass(frozen=True)
class Trainer:
    """What a training rule's jobs run: the training ``function`` and the ``settings`` class its jobs' params build,
    each named ``module:name`` and imported only when asked (:func:`training_function`, :func:`settings_class`).
    Named, not imported: every layer imports this module, the functions import torch, and the settings classes
    import this module."""

    function: str
    settings: str


#: Each training rule's trainer (a stage's ``trainer``): its jobs run it in one process or in torchrun's workers,
#: which get the stage's name and look it up here (:mod:`dpr_pipeline.training.launch`).
TRAINERS = {
    "train_retriever": Trainer("dpr_pipeline.training.biencoder:train_biencoder",
                               "dpr_pipeline.training.settings:BiEncoderSettings"),
    "train_distill": Trainer("dpr_pipeline.training.biencoder:train_biencoder",
                             "dpr_pipeline.training.settings:DistillSettings"),
    "train_reranker": Trainer("dpr_pipeline.training.cross_encoder:train_reranker",
                              "dpr_pipeline.training.settings:RerankerSettings"),
    "pretrain": Trainer("dpr_pipeline.pretraining.train:pretrain",
                        "dpr_pipeline.pretraining.settings:PretrainSettings"),
}


def _named(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def training_function(name: str):
    """The function that trains stage ``name`` (``retriever1``, ``pretrain/simlm``): its trainer's
    (:data:`TRAINERS`)."""
    return _named(TRAINERS[stage(name).trainer].function)


def settings_class(name: str) -> type:
    """The settings class of a training job of stage ``name``: its trainer's (:data:`TRAINERS`), a
    :class:`~dpr_pipeline.training.settings.StageSettings`."""
    return _named(TRAINERS[stage(name).trainer].settings)


#: The rules that train a stage, each with the config block whose ``processes`` sets its GPUs (torchrun, one
#: process per GPU).
GPU_TRAINING_RULES = {s.trainer: s.shares or s.block for s in CHAIN + FAMILIES if s.trainer is not None}
#: The rules that run a stage's model on one GPU.
GPU_INFERENCE_RULES = tuple(dict.fromkeys(rule for s in CHAIN + FAMILIES for rule in s.kind.gpu_rules))
#: Every rule that asks for GPUs (the others are CPU rules).
GPU_RULES = tuple(GPU_TRAINING_RULES) + GPU_INFERENCE_RULES
#: The one-GPU rules whose jobs are shards of one piece of work (a corpus's vectors, the teacher's or a mined pool's
#: scores), each with the wildcards that name the piece. A cluster profile submits them in groups of shards run one
#: after the other on one GPU (``group-components`` over :func:`shard_group`'s names; profiles/slurm/config.yaml).
SHARD_GROUPS = {"encode_corpus": ("dataset", "stage"), "transfer_encode_corpus": ("dataset", "stage", "target"),
                "teacher_scores_shard": ("dataset",), "denoise_scores": ("dataset", "stage")}


def shard_group(rule: str) -> str:
    """The Snakemake group of a shard rule's jobs (:data:`SHARD_GROUPS`): its name and the piece's wildcards,
    ``encode_corpus_{dataset}_{stage}``: one group per piece of work, never spanning two."""
    return "_".join([rule, *(f"{{{wildcard}}}" for wildcard in SHARD_GROUPS[rule])])


def trained_stage(rule: str, wildcards: dict) -> str:
    """The stage a job of training rule ``rule`` trains: its ``stage`` wildcard, a family's member for its
    ``method`` (``pretrain/simlm``), else the one chain stage the rule trains."""
    if "stage" in wildcards:
        return wildcards["stage"]
    if "method" in wildcards:
        return member(next(f for f in FAMILIES if f.trainer == rule), wildcards["method"])
    (name,) = trained_by(rule)
    return name


def torch_env(rule: str) -> str:
    """The conda environment of a rule that runs PyTorch: the CUDA one for a GPU rule, else the CPU one."""
    return GPU_ENV if rule in GPU_RULES else CPU_TORCH_ENV

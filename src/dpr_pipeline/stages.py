"""The workflow's stages, each declared once: its summary label, its kind (what its model is and which rules run
it), the config block holding its settings, the rule that trains it and the stage it is read against.

Everything else asks this module instead of listing stage names: the stage lists of ``rules/common.smk``
(``STAGES``, ``BIENCODERS``, ``TRAINED_STAGES``, …), the summary's labels, a bi-encoder's config block, the rules
that ask for GPUs (:mod:`dpr_pipeline.cluster`) and the conda environment of the rules that run PyTorch
(``envs/torch-gpu.yaml`` for a GPU rule, ``envs/torch.yaml`` otherwise). ``tests/test_stages.py`` checks that the
parsed workflow and the Slurm profile agree with it (a GPU rule never runs in the CPU environment).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """What a stage's model is, and the rules other than its trainer that run that model on a GPU (one each)."""

    name: str
    gpu_rules: tuple[str, ...] = ()


LEXICAL = Kind("lexical")                                                 # BM25: Lucene, on CPUs
PRETRAINED_ENCODER = Kind("pre-trained encoder")                          # a start for the bi-encoders, not scored
BIENCODER = Kind("bi-encoder", ("encode_corpus", "dense_search"))
CROSS_ENCODER = Kind("cross-encoder", ("rerank", "teacher_scores_shard"))


@dataclass(frozen=True)
class Stage:
    """One stage: its outputs live under ``results/{dataset}/{name}/``.

    ``block``: the config block of its settings (``stages.<block>``); ``trainer``: the rule that trains it, on the
    stage's ``processes`` GPUs (None: not trained); ``below``: the stage it improves on in the chain (SimLM
    Table 6), the one a seed spread reads it against; ``label``: its row in the summaries (None for a family,
    whose members are named by pre-training method)."""

    name: str
    label: str | None
    kind: Kind
    block: str
    trainer: str | None = None
    below: str | None = None

    @property
    def trains(self) -> bool:
        return self.trainer is not None


#: The main chain in pipeline order (SimLM Figure 2): each writes results/{dataset}/{stage}/run_{split}.trec and
#: is a row of the summary. `start` is the bi-encoders' starting model, untrained.
CHAIN = (
    Stage("bm25", "BM25", LEXICAL, "bm25"),
    Stage("start", "Starting model (untrained)", BIENCODER, "retriever"),
    Stage("retriever1", "Retriever₁", BIENCODER, "retriever", trainer="train_retriever", below="start"),
    Stage("retriever2", "Retriever₂", BIENCODER, "retriever", trainer="train_retriever", below="retriever1"),
    Stage("reranker", "Re-ranker", CROSS_ENCODER, "reranker", trainer="train_reranker", below="retriever2"),
    Stage("distill", "Retriever_distill", BIENCODER, "distill", trainer="train_distill", below="retriever2"),
)

#: Families of stages named ``<family>/<method>``, one member per pre-training method: the pre-trained encoders,
#: and SimLM Table 7's ablation (Retriever₁ fine-tuned from each encoder, ``none``: from the untrained plm).
PRETRAINING = Stage("pretrain", None, PRETRAINED_ENCODER, "pretrain", trainer="pretrain")
ABLATION = Stage("ablation", None, BIENCODER, "retriever", trainer="train_retriever")
FAMILIES = (PRETRAINING, ABLATION)

#: The conda environments of the rules that run PyTorch (relative to the repository root): a GPU rule's has CUDA
#: torch and faiss-gpu, the other's faiss-cpu.
GPU_ENV = "envs/torch-gpu.yaml"
CPU_TORCH_ENV = "envs/torch.yaml"


def stage(name: str) -> Stage:
    """The declaration of stage ``name``: a chain stage, or a family member (``ablation/simlm``)."""
    for declared in CHAIN:
        if declared.name == name:
            return declared
    family, _, member = name.partition("/")
    for declared in FAMILIES:
        if member and declared.name == family:
            return declared
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


#: The summaries' row label of each chain stage.
STAGE_LABELS = {s.name: s.label for s in CHAIN}
#: The stage each one is read against: the one it improves on in the chain (SimLM Table 6).
STAGE_BELOW = {s.name: s.below for s in CHAIN if s.below is not None}

#: The rules that train a stage, each with the config block whose ``processes`` sets its GPUs (torchrun, one
#: process per GPU).
GPU_TRAINING_RULES = {s.trainer: s.block for s in CHAIN + FAMILIES if s.trainer is not None}
#: The rules that run a stage's model on one GPU.
GPU_INFERENCE_RULES = tuple(dict.fromkeys(rule for s in CHAIN + FAMILIES for rule in s.kind.gpu_rules))
#: Every rule that asks for GPUs (the others are CPU rules).
GPU_RULES = tuple(GPU_TRAINING_RULES) + GPU_INFERENCE_RULES


def torch_env(rule: str) -> str:
    """The conda environment of a rule that runs PyTorch: the CUDA one for a GPU rule, else the CPU one."""
    return GPU_ENV if rule in GPU_RULES else CPU_TORCH_ENV

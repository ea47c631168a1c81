"""Training the cross-encoder re-ranker with the listwise loss of Eq. 4 (SimLM §3.2, Table 13).

Each training example is one query with a positive and ``negatives_per_query`` hard negatives drawn per
epoch from Retriever₂'s mined negatives (``QueryGroups``). The cross-encoder reads the concatenation of the
query and each passage and outputs θ(q, d); the loss is the softmax cross-entropy of the positive among its
group. The trained model is saved with ``save_pretrained`` (safetensors) and loads as a
``transformers.AutoModelForSequenceClassification`` or a ``sentence_transformers.CrossEncoder`` whose
``predict`` returns θ itself (no sigmoid), the score ``score_pairs`` computes.

Prompts: none. The pair goes in as it is, in training and in scoring; a ``plm`` folder's sentence-transformers
prompts are not applied, and a warning names them (docs/prompts.md).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import torch

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.models.devices import autocast, gpu_memory_gib, model_device, to_device
from dpr_pipeline.models.embedding import declared_prompts
from dpr_pipeline.models.loading import load_cross_encoder, load_tokenizer
from dpr_pipeline.models.packing import PackedBatch, pack, packed_attention_for, worth_packing
from dpr_pipeline.models.pair_scoring import encode_pairs, load_scorer
from dpr_pipeline.stages import settings_block
from dpr_pipeline.training.distributed import Distributed
from dpr_pipeline.training.groups import Group, QueryGroups, read_query_groups
from dpr_pipeline.training.losses import listwise_loss
from dpr_pipeline.training.pass_memory import model_size, resolve_micro_batch
from dpr_pipeline.training.settings import RerankerSettings
from dpr_pipeline.training.trainer import train

log = logging.getLogger(__name__)

GROUP_SIZE = "group_size"
# sentence-transformers reads this from config.json: CrossEncoder.predict then returns the raw logit θ(q, d).
SENTENCE_TRANSFORMERS_CONFIG = {"activation_fn": "torch.nn.modules.linear.Identity"}


def make_collate(tokenizer, max_length: int, packed: bool = False) -> Callable[[list[Group]], dict]:
    """Batch the groups as (query, passage) pairs, each query repeated for its positive and negatives; ``packed``:
    the pairs' real tokens packed (``input_ids`` a :class:`~dpr_pipeline.models.packing.PackedBatch`) where that is
    worth it (:func:`~dpr_pipeline.models.packing.worth_packing`)."""
    def collate(groups: list[Group]) -> dict:
        queries = [group.query for group in groups for _ in group.passages]
        passages = [passage for group in groups for passage in group.passages]
        pairs = encode_pairs(tokenizer, queries, passages, max_length=max_length)
        if packed and worth_packing(pairs["attention_mask"]):
            pairs = {"input_ids": pack(pairs["input_ids"], pairs["attention_mask"], pairs.get("token_type_ids"))}
        return {**pairs, GROUP_SIZE: len(groups[0].passages)}
    return collate


# The classification head of a sequence-classification model, given each pair's first-token state [N, 1, H] (what
# the head reads at position 0 of a padded batch): BERT's pooler, dropout and classifier; ELECTRA's and RoBERTa's
# classifier (dense, then out_proj).
PACKED_HEADS: dict[str, Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]] = {
    "bert": lambda model, first: model.classifier(model.dropout(model.bert.pooler(first))),
    "electra": lambda model, first: model.classifier(first),
    "roberta": lambda model, first: model.classifier(first),
    "xlm-roberta": lambda model, first: model.classifier(first),
}


def sequence_scores(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    """θ(q, d) [N] of a batch of pairs: padded, the model's own forward; packed (``input_ids`` a
    :class:`~dpr_pipeline.models.packing.PackedBatch`), its base model on the real tokens and its head
    (:data:`PACKED_HEADS`) on each pair's first token."""
    batch = inputs["input_ids"]
    if not isinstance(batch, PackedBatch):
        return model(**inputs).logits.squeeze(-1)
    hidden = model.base_model(**batch.model_inputs()).last_hidden_state[0]
    first = hidden.index_select(0, batch.first_rows)[:, None, :]
    return PACKED_HEADS[model.config.model_type](model, first).squeeze(-1)


class PairScorer(torch.nn.Module):
    """A sequence-classification model as the re-ranker trains it: ``forward(**pairs)`` is θ(q, d) [N]
    (:func:`sequence_scores`), padded or packed, in one forward, as DDP requires (a packed batch runs the base
    model and then the head, which the model's own forward cannot; under DDP, a call past its forward would
    skip the gradients' synchronisation setup)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    @property
    def base_model(self) -> torch.nn.Module:              # the trainer's head_learning_rate splits on it
        return self.model.base_model

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        self.model.gradient_checkpointing_enable(**kwargs)

    def forward(self, **pairs) -> torch.Tensor:
        return sequence_scores(self.model, pairs)


def listwise_batch_loss(model: PairScorer, batch: dict, dist: Distributed) -> torch.Tensor:
    """Eq. 4 over the batch: θ of each group [d⁺, n₁ … n_n] as one row, the positive first (``model`` a
    :class:`PairScorer`, DDP-wrapped or not)."""
    inputs = {key: value for key, value in batch.items() if key != GROUP_SIZE}
    return listwise_loss(model(**inputs).float().view(-1, batch[GROUP_SIZE]))


def listwise_loss_of(model_dir: str | Path, negatives_path: str | Path, passages_path: str | Path,
                     queries_path: str | Path, *, negatives_per_query: int, max_length: int, seed: int = 42,
                     batch_size: int = 8, bf16: bool = False) -> float:
    """The mean Eq. 4 loss of a saved re-ranker (or any ``plm``: an untrained head scores ~ln(1 + n)) over the
    groups of a negatives artifact (epoch 0's draw), without training: on held-out queries, whether it learned."""
    groups = read_query_groups(negatives_path, passages_path, queries_path, negatives_per_query, seed)
    model, tokenizer = load_scorer(model_dir)
    return mean_listwise_loss(model, make_collate(tokenizer, max_length), groups, batch_size=batch_size, bf16=bf16)


def mean_listwise_loss(model: torch.nn.Module, collate: Callable[[list[Group]], dict], groups: QueryGroups, *,
                       batch_size: int, bf16: bool = False) -> float:
    """The mean Eq. 4 loss of ``model`` over every group of ``groups`` (epoch 0's draw), in inference mode on
    the model's device (its batches are moved there)."""
    device, scorer = model_device(model), PairScorer(model)
    total = torch.zeros((), dtype=torch.float64, device=device)  # summed on the device: no sync per batch
    model.eval()
    with torch.inference_mode(), autocast(device, bf16):
        for start in range(0, len(groups), batch_size):
            examples = [groups.example(i, 0) for i in range(start, min(start + batch_size, len(groups)))]
            batch = to_device(collate(examples), device)
            total += listwise_batch_loss(scorer, batch, Distributed()).double() * len(examples)
    return float(total) / len(groups)


def save_reranker(model: torch.nn.Module, tokenizer, output_dir: str | Path, max_length: int) -> None:
    """``save_pretrained`` of model and tokenizer into ``output_dir``, atomically (no partial folder on error).

    The tokenizer's ``model_max_length`` becomes the training ``max_length``, so that a CrossEncoder loaded
    from the folder truncates pairs as training and ``score_pairs`` did.
    """
    model.config.sentence_transformers = SENTENCE_TRANSFORMERS_CONFIG
    tokenizer.model_max_length = max_length
    with atomic_output(output_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)


def train_reranker(negatives_path: str | Path, passages_path: str | Path, queries_path: str | Path,
                   output_dir: str | Path, checkpoint_dir: str | Path, loss_log: str | Path,
                   settings: RerankerSettings, stage: str | None = None, tracking: dict | None = None) -> None:
    """Train the re-ranker ``plm`` of ``settings`` on a negatives artifact and save it to ``output_dir``.

    ``settings``: the job's (plm, max_length, negatives_per_query and the ``TrainingSettings``: learning_rate,
    warmup_steps, batch_size = queries per step, epochs, ...); ``stage``: the job's stage, whose settings its
    errors name; ``tracking``: its tracked run (:func:`dpr_pipeline.training.trainer.train`).
    """
    training = settings.training
    dist = Distributed.from_environment()
    groups = read_query_groups(negatives_path, passages_path, queries_path, settings.negatives_per_query,
                               training.seed)
    tokenizer = load_tokenizer(settings.plm)
    # the classification head is new (random): seeded, so that a rerun trains the same re-ranker (torch's
    # default seed differs per process, and this head's start moved SciFact's nDCG@10 by 0.05 between runs)
    torch.manual_seed(training.seed)
    model = load_cross_encoder(settings.plm, settings.attention_dropout)
    log.info("re-ranker %s: %d queries, groups of 1 positive + %d negatives; no prompts (each (query, passage) "
             "pair goes in as it is)", settings.plm, len(groups), settings.negatives_per_query)
    declared = {name: text for name, text in declared_prompts(settings.plm)[0].items() if text}
    if declared:
        log.warning("the re-ranker's plm %s declares prompts %s, which the re-ranker does not apply (it is "
                    "fine-tuned on the bare pairs; docs/prompts.md)", settings.plm, declared)
    training = resolve_micro_batch(
        training, min(training.batch_size, len(groups)) // dist.world_size,
        (1 + settings.negatives_per_query) * settings.max_length, gpu_memory_gib(dist.device), **model_size(model),
        setting=f"stages.{settings_block(stage) or settings.BLOCK}.micro_batch_size")
    head_known = model.config.model_type in PACKED_HEADS
    with packed_attention_for(model, "re-ranker training", None if head_known else
                              f"no packed head for a {model.config.model_type!r} classifier") as packed:
        model = train(PairScorer(model), groups, make_collate(tokenizer, settings.max_length, packed),
                      listwise_batch_loss, training, checkpoint_dir, loss_log=loss_log, dist=dist,
                      description="re-ranker", stage=stage, tracking=tracking).model
    if dist.is_main:
        save_reranker(model, tokenizer, output_dir, settings.max_length)

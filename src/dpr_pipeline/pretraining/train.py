"""Pre-train the encoder on the tokenized target corpus and save it for the retrievers.

The shared trainer (:mod:`dpr_pipeline.training.trainer`) runs the loop: ``train_steps`` steps of
``batch_size`` passages drawn as seeded per-epoch permutations, AdamW with linear warm-up and decay, bf16
autocast on GPU, DDP under torchrun, resumable checkpoints and a loss log. The encoder is then saved with
``save_pretrained`` (safetensors, plus sentence-transformers files pooling as its bottleneck did: [CLS] or the
mean), so ``plm:`` can point at it.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from transformers import AutoModelForMaskedLM, BertConfig, BertForMaskedLM

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.errors import DataError
from dpr_pipeline.models import loading as models
from dpr_pipeline.models.embedding import TextEncoder, resolve_pooling, resolve_prompts, save_text_encoder
from dpr_pipeline.models.packing import pack, packed_attention_for, worth_packing
from dpr_pipeline.pretraining.masking import content_positions
from dpr_pipeline.pretraining.methods import (RANDOM_GENERATOR, ObjectiveSettings, PretrainingMethod,
                                              pretraining_method)
from dpr_pipeline.pretraining.objectives import (PretrainingModel, SpecialTokens, TokenGenerator, compile_layers,
                                                 mask_rows)
from dpr_pipeline.pretraining.settings import GeneratorSettings, PretrainSettings
from dpr_pipeline.pretraining.token_importance import NgramCounts, ami_importance
from dpr_pipeline.pretraining.tokens import TokenizedCorpus, read_token_shards
from dpr_pipeline.training.distributed import Distributed
from dpr_pipeline.training.schedule import check_micro_batch
from dpr_pipeline.training.trainer import train
from dpr_pipeline.stages import settings_block

log = logging.getLogger(__name__)

class PassageData:
    """Training examples for the trainer: passage ``index``'s token ids; with ``span_pairs`` (coCondenser) two
    random spans of it (each half the passage's content tokens, [CLS]/[SEP] around them), drawn from (seed, index,
    epoch)."""

    def __init__(self, corpus: TokenizedCorpus, span_pairs: bool, seed: int):
        self.corpus = corpus
        self.span_pairs = span_pairs
        self.seed = seed

    def __len__(self) -> int:
        return len(self.corpus)

    def example(self, index: int, epoch: int) -> list[np.ndarray]:
        ids = self.corpus[index].astype(np.int64)
        if not self.span_pairs:
            return [ids]
        content = ids[1:-1]
        length = max(1, -(-len(content) // 2))
        rng = np.random.default_rng([self.seed, index, epoch])
        starts = rng.integers(0, max(1, len(content) - length + 1), size=2)
        return [np.concatenate([ids[:1], content[start:start + length], ids[-1:]]) for start in starts]


class PretrainingCollator:
    """Pad a list of examples into ``input_ids``, ``attention_mask``, ``content``, ``content_rows`` (``content``'s flat
    indices, made here on the host so that the step on a GPU need not wait to learn their number) and, given
    n-gram counts, the token importance a method declaring ``ngram_counts`` reads. ``packed``: where it is worth it
    (:func:`~dpr_pipeline.models.packing.worth_packing`), the texts' real tokens packed into one row (each [1, T]),
    ``attention_mask`` then the :class:`~dpr_pipeline.models.packing.PackedBatch` that says where each text lies."""

    def __init__(self, special: SpecialTokens, ngram_counts: NgramCounts | None = None, window: int = 4,
                 packed: bool = False):
        self.special = special
        self.ngram_counts = ngram_counts
        self.window = window
        self.packed = packed

    def __call__(self, examples: list[list[np.ndarray]]) -> dict:
        sequences = [s for example in examples for s in example]
        width = max(len(s) for s in sequences)
        input_ids = np.full((len(sequences), width), self.special.pad, dtype=np.int64)
        attention_mask = np.zeros((len(sequences), width), dtype=np.int64)
        for row, sequence in enumerate(sequences):
            input_ids[row, :len(sequence)] = sequence
            attention_mask[row, :len(sequence)] = 1
        batch = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention_mask)}
        batch["content"] = content_positions(batch["input_ids"], batch["attention_mask"], self.special.ids)
        if self.ngram_counts is not None:
            batch["importance"] = torch.from_numpy(
                ami_importance(input_ids, batch["content"].numpy(), self.ngram_counts, self.window))
        if self.packed and worth_packing(batch["attention_mask"]):
            packed = pack(batch["input_ids"], batch["attention_mask"])
            batch = {key: value.flatten(0, 1)[packed.rows][None] for key, value in batch.items()}
            batch["attention_mask"] = packed
        batch["content_rows"] = mask_rows(batch["content"])
        return batch


def load_masked_lm(reference: str, attention_dropout: float | None = None) -> torch.nn.Module:
    """A ``BertForMaskedLM`` from a model reference; its LM head is new when the checkpoint has none;
    ``attention_dropout`` overrides the model's own (None keeps it)."""
    model_type = models.load_model_config(reference).model_type
    if model_type != "bert":
        raise DataError(reference, f"pre-training needs a BERT encoder, this is a {model_type!r} model",
                        "set stages.pretrain.plm to a BERT model (bert-base-uncased, MiniLM, ...)")
    model, _ = models.load_model(reference, "masked language model", BertForMaskedLM.from_pretrained,
                                 **models.dropout_overrides(reference, attention_dropout))
    return model


def build_generator(settings: GeneratorSettings, encoder_config, vocab_size: int) -> TokenGenerator:
    """The generator: a pre-trained masked LM (``generator``: a model reference; frozen unless
    ``train_generator``) or ``random``: a small BERT (``random_generator_hidden_size``/``_layers``, the encoder's
    attention dropout) trained jointly from random initialisation (SimLM Table 12: all three variants pre-train
    equally well)."""
    reference = settings.generator
    if reference == RANDOM_GENERATOR:
        hidden = settings.random_generator_hidden_size
        config = BertConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=4 * hidden,
                            num_hidden_layers=settings.random_generator_layers,
                            num_attention_heads=max(1, hidden // 64),
                            max_position_embeddings=encoder_config.max_position_embeddings,
                            attention_probs_dropout_prob=encoder_config.attention_probs_dropout_prob)
        return TokenGenerator(BertForMaskedLM(config), trainable=True)
    model, head = models.load_model(reference, "generator", AutoModelForMaskedLM.from_pretrained,
                                    new_head=False)
    if head:  # a head drawn at random would replace tokens with noise, and the run would not say so
        raise DataError(reference, f"the generator has no masked-LM head: {models.few_names(head)} missing from "
                        "its weights",
                        "set pretrain.generator to a masked language model: a Hub masked LM such as "
                        "google/electra-base-generator, an encoder pre-trained by this workflow "
                        "(results/<dataset>/pretrain/<method>/model, saved with its LM head), or `random`")
    if model.config.vocab_size != vocab_size:
        raise ValueError(f"generator {reference!r} has a vocabulary of {model.config.vocab_size} tokens, the "
                         f"encoder {vocab_size}: use a generator with the encoder's tokenizer")
    return TokenGenerator(model, trainable=settings.train_generator)


def objective_settings(settings: PretrainSettings) -> ObjectiveSettings:
    """The method's settings, ``bottleneck: auto`` resolved to the plm's own pooling ([CLS] for a folder that
    records none, as bert-base-uncased)."""
    objective = settings.objective
    return dataclasses.replace(objective, bottleneck=resolve_pooling(settings.plm, objective.bottleneck))


def build_model(settings: PretrainSettings, tokenizer) -> PretrainingModel:
    objective = objective_settings(settings)
    masked_lm = load_masked_lm(settings.plm, settings.attention_dropout)
    generator = build_generator(settings.token_generator, masked_lm.config, masked_lm.config.vocab_size) \
        if pretraining_method(objective.method).generator else None
    return PretrainingModel(masked_lm, objective, SpecialTokens.of(tokenizer), generator)


def default_step(model, batch: dict, dist) -> torch.Tensor:
    return model(batch["input_ids"], batch["attention_mask"], batch["content"], batch.get("importance"),
                 batch.get("content_rows"))["loss"]


def training_step(method: PretrainingMethod, settings: ObjectiveSettings):
    """How ``method`` steps: its own step (coCondenser's) or one forward pass whose ``loss`` the trainer minimises."""
    return default_step if method.step is None else method.step(settings)


def save_pretrained_encoder(model: PretrainingModel, tokenizer, output_dir: str | Path, max_length: int,
                            prompts) -> None:
    """The pre-trained encoder as a sentence-transformers folder, pooled as the bottleneck it pre-trained ([CLS] or
    mean) and keeping the plm's prompts, whose weights are the whole masked LM (the encoder and its LM head, as
    bert-base-uncased and coCondenser's checkpoints ship them): the bi-encoders load the encoder and leave the head,
    and the folder is a masked LM that continued pre-training starts from with its head, or SimLM takes as its
    generator (``pretrain.generator``). Decoder, generator and other heads are not saved. Whole or not at all."""
    with atomic_output(output_dir) as tmp:
        save_text_encoder(TextEncoder(model.encoder.cpu(), model.settings.bottleneck, prompts), tokenizer, tmp,
                          max_length)
        model.masked_lm.cpu().save_pretrained(tmp, safe_serialization=True)  # the same encoder, with its head


def pretrain(token_shards: Sequence[str], output_dir: str | Path, checkpoint_dir: str | Path,
             loss_log: str | Path, settings: PretrainSettings, ngram_counts: str | None = None,
             stage: str | None = None, tracking: dict | None = None) -> None:
    """Pre-train the ``plm`` with the ``method`` of ``settings`` and save the encoder to ``output_dir``
    (``stage``: the job's, ``pretrain/<method>``, whose settings its errors name; ``tracking``: its tracked run)."""
    training, objective = settings.training, settings.objective
    dist = Distributed.from_environment()
    tokenizer = models.load_tokenizer(settings.plm)
    corpus = read_token_shards(token_shards, tokenizer)
    method = pretraining_method(objective.method)
    counts = NgramCounts.load(ngram_counts) if method.ngram_counts else None
    torch.manual_seed(training.seed)  # new layers and a random generator start the same in every run
    model = build_model(settings, tokenizer)
    if settings.compile:
        log.info("torch.compile: %d Transformer layers", compile_layers(model))
    data = PassageData(corpus, span_pairs=method.span_pairs, seed=training.seed)
    if method.step is not None and training.micro_batch_size:
        # a method with its own step chunks the batch itself: coCondenser's gradient cache, in spans (two a passage)
        objective = dataclasses.replace(
            objective, gradient_cache_chunk=objective.gradient_cache_chunk or 2 * training.micro_batch_size)
        check_micro_batch(training.batch_size, dist.world_size, training.micro_batch_size,
                          f"stages.{settings_block(stage) or 'pretrain'}.micro_batch_size")
        training = dataclasses.replace(training, micro_batch_size=None)
    step = training_step(method, objective)
    log.info("pre-training %s with %s (bottleneck: %s) on %d passages (%d tokens)", settings.plm, method.name,
             model.settings.bottleneck, len(corpus), corpus.num_tokens)
    with packed_attention_for(model, f"pre-training ({method.name})",
                              None if method.unpadded else f"{method.name}'s loss reads the padded layout") as packed:
        collate = PretrainingCollator(SpecialTokens.of(tokenizer), counts, settings.cdmae_window, packed)
        train(model, data, collate, step, training, checkpoint_dir,
              cross_device_loss=False, loss_log=loss_log, dist=dist, description=f"pre-training ({method.name})",
              stage=stage, tracking=tracking)
    if dist.is_main:
        save_pretrained_encoder(model, tokenizer, output_dir, corpus.max_length, resolve_prompts(settings.plm))
        log.info("saved the encoder and its LM head to %s", output_dir)

"""Bi-encoder training: Retriever₁ and Retriever₂ (Eq. 3) and the distilled retriever (Eq. 5 + α·Eq. 3).

One shared :class:`~dpr_pipeline.models.embedding.TextEncoder` embeds queries and passages as L2-normalised pooled
vectors (the stage's ``pooling``: ``auto`` takes the starting model's own), each text after its prompt (the
starting model's, or the stage's ``query_prompt`` / ``passage_prompt``), which the saved model keeps. Vectors are
gathered across processes before the loss, so every query sees every process's passages as negatives
(cross-device negatives); with one process the loss is the same as over the joint batch.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.models.devices import gpu_memory_gib
from dpr_pipeline.models.embedding import Prompts, TextEncoder, load_text_encoder, save_text_encoder
from dpr_pipeline.models.loading import load_tokenizer
from dpr_pipeline.models.packing import pack, packed_attention_for, worth_packing
from dpr_pipeline.training.dev_selection import select
from dpr_pipeline.stages import settings_block
from dpr_pipeline.training.distributed import Distributed
from dpr_pipeline.training.grad_cache import joined
from dpr_pipeline.training.groups import read_query_groups
from dpr_pipeline.training.losses import contrastive_loss, distillation_loss
from dpr_pipeline.training.pass_memory import model_size, resolve_micro_batch
from dpr_pipeline.training.schedule import STEP_KEYS, epochs_visited
from dpr_pipeline.training.selection_record import write_selection
from dpr_pipeline.training.settings import BiEncoderSettings, DevSelection, DistillSettings
from dpr_pipeline.training.trainer import train

log = logging.getLogger(__name__)


def passage_key(doc_id: str) -> int:
    """A 63-bit integer standing for a doc id, so that processes can exchange ids as a tensor."""
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "little") >> 1


class BiEncoderCollator:
    """Tokenise a list of groups: queries [B] and passages [B·(1+n)] (each query's positive first), each after
    its prompt (``prompts``: the encoder's; none by default); ``packed``: their real tokens packed
    (:class:`~dpr_pipeline.models.packing.PackedBatch`, attention masks None) where that is worth it for the batch
    as a whole (:func:`~dpr_pipeline.models.packing.worth_packing`), else padded."""

    def __init__(self, tokenizer, query_max_length: int, passage_max_length: int, prompts: Prompts | None = None,
                 packed: bool = False):
        self.tokenizer = tokenizer
        self.query_max_length = query_max_length
        self.passage_max_length = passage_max_length
        self.prompts = prompts if prompts is not None else Prompts()
        self.packed = packed

    def __call__(self, groups: list) -> dict:
        queries = self.tokenizer([self.prompts.query + g.query for g in groups], truncation=True,
                                 max_length=self.query_max_length, padding=True, return_tensors="pt")
        passages = self.tokenizer([self.prompts.passage + p for g in groups for p in g.passages], truncation=True,
                                  max_length=self.passage_max_length, padding=True, return_tensors="pt")
        batch = {"query_input_ids": queries["input_ids"], "query_attention_mask": queries["attention_mask"],
                 "passage_input_ids": passages["input_ids"], "passage_attention_mask": passages["attention_mask"],
                 "passage_keys": torch.tensor([passage_key(d) for g in groups for d in g.passage_ids])}
        if self.packed and worth_packing(batch["query_attention_mask"], batch["passage_attention_mask"]):
            for side in ("query", "passage"):
                batch[f"{side}_input_ids"] = pack(batch[f"{side}_input_ids"], batch.pop(f"{side}_attention_mask"))
                batch[f"{side}_attention_mask"] = None
        if groups and groups[0].scores is not None:
            batch["teacher_scores"] = torch.tensor([g.scores for g in groups], dtype=torch.float32)
        return batch


class BiEncoder(torch.nn.Module):
    """One shared encoder for queries and passages; one ``forward`` per step, as DDP requires. ``prompt_tokens``:
    the (query, passage) prompt tokens pooling leaves out (:meth:`TextEncoder.prompt_tokens`; none by default)."""

    def __init__(self, encoder: TextEncoder, prompt_tokens: tuple[int, int] = (0, 0)):
        super().__init__()
        self.encoder = encoder
        self.prompt_tokens = prompt_tokens

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        self.encoder.gradient_checkpointing_enable(**kwargs)

    def forward(self, query_input_ids, query_attention_mask, passage_input_ids, passage_attention_mask):
        query_prompt, passage_prompt = self.prompt_tokens
        return (self.encoder(query_input_ids, query_attention_mask, query_prompt),
                self.encoder(passage_input_ids, passage_attention_mask, passage_prompt))


def full_precision(tensor: torch.Tensor):
    """Autocast off: the similarities are divided by τ (0.02), so bf16's 3 significant digits would add
    noise of ~0.2 to every logit."""
    return torch.autocast(tensor.device.type, enabled=False)


class BiEncoderLoss:
    """A bi-encoder stage's loss over the global batch: Eq. 3 (``alpha`` None) or the distillation loss
    L_kl + α·L_cont (Eq. 5), in two parts for gradient caching (:class:`~dpr_pipeline.training.grad_cache.CachedLoss`):
    ``represent``, the query and passage vectors of one collated batch; ``loss``, the loss of the chunks' vectors
    joined (each chunk whole queries with their groups, so the passages stay grouped per query) and gathered from
    every process, with the chunks' passage keys and teacher scores. Called as ``loss_fn(model, batch, dist)``: the
    one-pass step."""

    def __init__(self, temperature: float, alpha: float | None = None, teacher_temperature: float = 1.0):
        self.temperature, self.alpha, self.teacher_temperature = temperature, alpha, teacher_temperature

    def represent(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return model(batch["query_input_ids"], batch["query_attention_mask"],
                     batch["passage_input_ids"], batch["passage_attention_mask"])

    def loss(self, representations: tuple[torch.Tensor, torch.Tensor], batches: list[dict],
             dist: Distributed) -> torch.Tensor:
        queries, passages = (dist.gather(vectors) for vectors in representations)
        keys = dist.gather(joined(batches, "passage_keys"))
        with full_precision(queries):
            if self.alpha is None:
                return contrastive_loss(queries, passages, self.temperature, keys)
            return distillation_loss(queries, passages, dist.gather(joined(batches, "teacher_scores")),
                                     self.temperature, self.alpha, keys, self.teacher_temperature)

    def __call__(self, model: torch.nn.Module, batch: dict, dist: Distributed) -> torch.Tensor:
        return self.loss(self.represent(model, batch), [batch], dist)


def contrastive_step(temperature: float) -> BiEncoderLoss:
    return BiEncoderLoss(temperature)


def distillation_step(temperature: float, alpha: float, teacher_temperature: float = 1.0) -> BiEncoderLoss:
    return BiEncoderLoss(temperature, alpha, teacher_temperature)


def train_biencoder(negatives_path: str | Path, passages_path: str | Path, queries_path: str | Path,
                    output_dir: str | Path, checkpoint_dir: str | Path, loss_log: str | Path,
                    settings: BiEncoderSettings, *, selection: DevSelection | None = None, stage: str | None = None,
                    tracking: dict | None = None) -> None:
    """Fine-tune the ``plm`` of ``settings`` on a negatives artifact and save it to ``output_dir``.

    Retriever (:class:`~dpr_pipeline.training.settings.BiEncoderSettings`): Eq. 3 over in-batch and hard
    negatives. Distilled retriever (:class:`~dpr_pipeline.training.settings.DistillSettings`): the artifact carries
    the re-ranker's scores and the loss is L_kl + α·L_cont.

    ``selection`` (:func:`dpr_pipeline.training.dev_selection.select`'s, its ``output`` where its record goes): the
    saved model is the trained one or, where that scores lower on the dev split, the model it started from.
    ``stage``: the job's stage (``retriever1``, ``distill``, ``ablation/simlm``), whose settings its errors name;
    ``tracking``: its tracked run (:func:`dpr_pipeline.training.trainer.train`).
    """
    distill = isinstance(settings, DistillSettings)
    training = settings.training
    dist = Distributed.from_environment()
    groups = read_query_groups(negatives_path, passages_path, queries_path, settings.negatives_per_query,
                               training.seed, with_scores=distill)
    if distill:
        groups.check_scores(epochs_visited(len(groups), **{key: getattr(training, key) for key in STEP_KEYS}))
    tokenizer = load_tokenizer(settings.plm)
    encoder = load_start(settings, settings.attention_dropout)
    prompts = encoder.prompts
    model = BiEncoder(encoder, (encoder.prompt_tokens(tokenizer, prompts.query),
                                encoder.prompt_tokens(tokenizer, prompts.passage)))
    log.info("%s: %s pooling; %s", settings.plm, encoder.pooling, prompts.describe())
    step = distillation_step(settings.temperature, settings.alpha, settings.teacher_temperature) if distill \
        else contrastive_step(settings.temperature)
    description = "distilled retriever" if distill else "retriever"
    training = resolve_micro_batch(
        training, min(training.batch_size, len(groups)) // dist.world_size,
        settings.query_max_length + (1 + settings.negatives_per_query) * settings.passage_max_length,
        gpu_memory_gib(dist.device), **model_size(encoder.transformer),
        setting=f"stages.{settings_block(stage) or settings.BLOCK}.micro_batch_size")
    with packed_attention_for(encoder.transformer, f"{description} training") as packed:
        collate = BiEncoderCollator(tokenizer, settings.query_max_length, settings.passage_max_length, prompts,
                                    packed)
        train(model, groups, collate, step, training, checkpoint_dir, cross_device_loss=True, loss_log=loss_log,
              dist=dist, description=description, stage=stage, tracking=tracking)
    if dist.is_main:
        handed_on = model.encoder
        if selection is not None:
            handed_on, record = select(model.encoder, lambda: load_start(settings), tokenizer, groups.passages,
                                       settings, selection, device=dist.device)
            write_selection(selection.output, record)
        with atomic_output(output_dir) as tmp:
            save_text_encoder(handed_on.cpu(), tokenizer, tmp, settings.passage_max_length,
                              settings.query_max_length)
        log.info("saved %s", output_dir)


def load_start(settings: BiEncoderSettings, attention_dropout: float | None = None) -> TextEncoder:
    """The model a bi-encoder stage starts from (``plm``), with the stage's pooling and prompts; for training,
    its attention dropout overridden unless None."""
    torch.manual_seed(settings.training.seed)  # any weights new to the loaded model start the same in every run
    return load_text_encoder(settings.plm, settings.pooling, attention_dropout, settings.query_prompt,
                             settings.passage_prompt)

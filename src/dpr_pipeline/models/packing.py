"""Unpadded batches: the Transformer computes on the batch's real tokens only.

A padded batch [B, L] (``input_ids`` and ``attention_mask``) becomes one packed row [1, T] of its B texts' real
tokens, T = Σ lengths, with position ids restarting at each text (:func:`pack`, on the host, as collators run).
The embeddings, the linear layers, GELU and LayerNorm then run on T rows instead of B·L; at MS MARCO's lengths
(passages of ~75 tokens under a 144-token cap) that is ~40 % fewer of the FLOPs that dominate a BERT step.
Attention must still see each text alone. The model's attention goes through transformers' attention interface,
under the name :data:`PACKED_ATTENTION` (:func:`packed_attention_for`), a function that, given the packed
batch's sequence boundaries (``cu_seq_lens_q``, transformers' own keyword for packed sequences), runs

* ``varlen`` on CUDA in bf16/fp16 without attention dropout: FlashAttention's variable-length kernel
  (``torch.nn.attention.varlen.varlen_attn``), the packed rows as they are;
* ``padded`` elsewhere (a CPU, float32, attention dropout in training): each text's queries, keys and values put
  back into a [B, L] layout for SDPA with the padding mask, and its output taken back out: the attention is
  exactly the padded model's, everything around it unpadded;

and without boundaries (a padded batch) is transformers' SDPA. The result equals the padded model's at the real
tokens, up to float rounding (tests/test_packing.py: outputs, losses and gradients). A collator packs a batch when
it is worth it (:func:`worth_packing`: a fifth of its slots or more are padding), else leaves it padded. A model
whose attention does not go through that interface keeps the padded batches (:func:`packing_supported`); the log
says which path ran.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

log = logging.getLogger(__name__)

PACKED_ATTENTION = "dpr_packed_sdpa"
#: A batch is packed when at least this share of its token slots is padding. Measured (benchmarks/README.md, "Issue
#: 53"): packing pays at 26–46 % padding (1.05–1.44× on a CPU, 1.14–1.42× for the GPU's model steps but the
#: re-ranker's) and loses at 7–8 % (0.5–1.0× on a CPU), where its extra copies outweigh the FLOPs it saves.
PACK_FROM_PADDING = 0.2
_logged_paths: set[str] = set()


@dataclass(frozen=True)
class PackedBatch:
    """B texts' real tokens in one row. ``rows`` [T]: each token's flat index in the padded [B, L] layout;
    ``sequence`` [T]: its text; ``cu_seq_lens`` [B + 1] (int32): where each text starts and ends;
    ``max_length``: the longest text (a host number, as the kernels take it)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    token_type_ids: torch.Tensor | None
    cu_seq_lens: torch.Tensor
    rows: torch.Tensor
    sequence: torch.Tensor
    key_mask: torch.Tensor
    max_length: int

    @property
    def num_texts(self) -> int:
        return self.cu_seq_lens.shape[0] - 1

    @property
    def first_rows(self) -> torch.Tensor:
        """Each text's first token ([CLS]) in the packed row."""
        return self.cu_seq_lens[:-1].long()

    def to(self, device: torch.device, non_blocking: bool = False) -> "PackedBatch":
        return replace(self, **{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
                                for f in fields(self) if torch.is_tensor(getattr(self, f.name))})

    def model_inputs(self) -> dict:
        """Keyword arguments of a Hugging Face encoder's forward (the boundaries reach the attention function)."""
        inputs = {"input_ids": self.input_ids, "position_ids": self.position_ids, **self.attention_kwargs()}
        if self.token_type_ids is not None:
            inputs["token_type_ids"] = self.token_type_ids
        return inputs

    def attention_kwargs(self) -> dict:
        """What a Transformer layer passes on to :func:`packed_attention`: the texts' boundaries (transformers'
        keywords for packed sequences) and, for the per-text SDPA path, the padded layout."""
        return {"cu_seq_lens_q": self.cu_seq_lens, "cu_seq_lens_k": self.cu_seq_lens,
                "max_length_q": self.max_length, "max_length_k": self.max_length,
                "packed_rows": self.rows, "packed_key_mask": self.key_mask}


def worth_packing(*attention_masks: torch.Tensor) -> bool:
    """Whether a padded batch (the masks of all its parts: a bi-encoder's queries and passages) has enough padding
    to pack (:data:`PACK_FROM_PADDING` of all its slots); read on the host."""
    real = sum(float(mask.sum()) for mask in attention_masks)
    return 1 - real / sum(mask.numel() for mask in attention_masks) >= PACK_FROM_PADDING


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor,
         token_type_ids: torch.Tensor | None = None) -> PackedBatch:
    """The padded batch's real tokens packed (on the host: the collators call it, so nothing here waits on a GPU).
    Padding may be on either side; each text's tokens stay in their order."""
    if input_ids.is_cuda:
        raise ValueError("pack() runs where batches are made (the host): its selections would wait on the GPU")
    real = attention_mask.bool()
    lengths = real.sum(dim=1)
    if (lengths == 0).any():
        raise ValueError("pack(): a text without tokens")
    rows = real.flatten().nonzero().squeeze(1)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    sequence = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    positions = torch.arange(len(rows)) - cu[:-1].long()[sequence]
    return PackedBatch(input_ids=input_ids.flatten()[rows][None], position_ids=positions[None],
                       token_type_ids=None if token_type_ids is None else token_type_ids.flatten()[rows][None],
                       cu_seq_lens=cu, rows=rows, sequence=sequence, key_mask=real, max_length=int(lengths.max()))


def _configs(model: torch.nn.Module) -> list:
    """The distinct transformers configs of ``model``'s modules (a pre-training model holds several: the encoder's,
    its decoder layers' copies, the generator's)."""
    found = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if isinstance(config, PretrainedConfig):
            found.setdefault(id(config), config)
    return list(found.values())


def packing_supported(model: torch.nn.Module) -> bool:
    """Whether every Transformer in ``model`` has its attention go through transformers' attention interface
    (BERT, ELECTRA, RoBERTa … in transformers 5), in SDPA or eager mode, and so can take :data:`PACKED_ATTENTION`."""
    pretrained = [m for m in model.modules() if isinstance(m, PreTrainedModel)]
    return bool(pretrained) and all(m._supports_attention_backend for m in pretrained) and all(
        config._attn_implementation in ("sdpa", "eager", PACKED_ATTENTION) for config in _configs(model))


@contextlib.contextmanager
def packed_attention_for(model: torch.nn.Module, what: str, unsupported: str | None = None):
    """Within the block ``model`` (a transformers model) takes packed batches where it can: its attention is
    :data:`PACKED_ATTENTION` (SDPA for any padded batch), its own again after. Yields whether batches may be packed,
    and logs which path ``what`` (e.g. "retriever training") runs; ``unsupported``: why the caller cannot pack for
    this model (None: it can, if the model can)."""
    if unsupported is None and not packing_supported(model):
        unsupported = (f"{type(model).__name__}'s attention is not transformers' attention interface in SDPA or "
                       "eager mode")
    if unsupported is not None:
        log.info("%s: padded batches (%s)", what, unsupported)
        yield False
        return
    configs = _configs(model)
    own = [config._attn_implementation for config in configs]
    for config in configs:
        config._attn_implementation = PACKED_ATTENTION
    log.info("%s: a batch with %d %% or more padding is unpadded (its real tokens packed; attention per text: "
             "FlashAttention varlen on CUDA in bf16, else SDPA); the first packed batch logs which ran", what,
             round(100 * PACK_FROM_PADDING))
    try:
        yield True
    finally:
        for config, implementation in zip(configs, own):
            config._attn_implementation = implementation


def pooled_rows(hidden: torch.Tensor, packed: PackedBatch, pooling: str, skip: int = 0) -> torch.Tensor:
    """One vector per text [B, H] from packed last-layer states ``hidden`` [T, H], in float32 or wider: ``cls``
    the text's first token (after ``skip`` prompt tokens), ``mean`` the mean of its tokens (from the ``skip``-th
    on), as :func:`~dpr_pipeline.models.embedding.pool` pools a padded batch."""
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    if pooling == "cls":  # a text that is all prompt: its first token, as pool() takes it
        start = packed.first_rows
        first = torch.where(start + skip < packed.cu_seq_lens[1:].long(), start + skip, start)
        return hidden.index_select(0, first).to(dtype)
    weight = (packed.position_ids[0] >= skip).to(dtype)
    sums = hidden.new_zeros((packed.num_texts, hidden.shape[1]), dtype=dtype).index_add_(
        0, packed.sequence, hidden.to(dtype) * weight[:, None])
    counts = weight.new_zeros(packed.num_texts).index_add_(0, packed.sequence, weight)
    return sums / counts.clamp(min=1)[:, None]


def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention function signature: ``query``/``key``/``value`` [1, heads, T, head_dim] for a packed
    batch (``cu_seq_lens_q`` given), returns [1, T, heads, head_dim]; any other batch goes to SDPA."""
    boundaries = kwargs.get("cu_seq_lens_q")
    if boundaries is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [T, heads, head_dim]
    if _varlen_applies(q, dropout):
        _log_path("varlen")
        from torch.nn.attention.varlen import varlen_attn  # heavy: CUDA kernels, only where it runs

        out = varlen_attn(q, k, v, boundaries, boundaries, kwargs["max_length_q"], kwargs["max_length_q"],
                          scale=scaling)
        return out[None], None
    _log_path("padded")
    rows, key_mask = kwargs["packed_rows"], kwargs["packed_key_mask"]
    batch, length = key_mask.shape

    def padded(x):
        return x.new_zeros((batch * length, *x.shape[1:])).index_copy(0, rows, x).view(batch, length, *x.shape[1:])

    out = F.scaled_dot_product_attention(*(padded(x).transpose(1, 2) for x in (q, k, v)),
                                         attn_mask=key_mask[:, None, None, :], dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).flatten(0, 1).index_select(0, rows)[None], None


@functools.cache
def _has_varlen() -> bool:
    return importlib.util.find_spec("torch.nn.attention.varlen") is not None


def _varlen_applies(query: torch.Tensor, dropout: float) -> bool:
    return query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and dropout == 0.0 and _has_varlen()


def _log_path(path: str) -> None:
    if path not in _logged_paths:
        _logged_paths.add(path)
        log.info("packed attention: %s", "FlashAttention varlen (CUDA)" if path == "varlen"
                 else "per text through SDPA with the padding mask (no varlen kernel here: a CPU, float32 or "
                      "attention dropout)")


AttentionInterface.register(PACKED_ATTENTION, packed_attention)
AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)

"""The pre-training model: a BERT encoder with its masked-LM head, the modules its method declares, and the
building blocks the methods' losses are written in (:mod:`~dpr_pipeline.pretraining.methods`); coCondenser's step.

The encoder alone (``model.encoder``) is what the retrievers start from.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.bert.modeling_bert import BertLayer

from dpr_pipeline.models.embedding import POOLING_MODES, pool
from dpr_pipeline.models.packing import PackedBatch, pooled_rows
from dpr_pipeline.pretraining.masking import bert_corrupt, nested_mask, random_mask
from dpr_pipeline.pretraining.methods import Decoder, ObjectiveSettings, pretraining_method
from dpr_pipeline.pretraining.token_importance import importance_aware_mask
from dpr_pipeline.training.losses import at_least_float32, linear_cross_entropy_and_samples, linear_cross_entropy_sum


@dataclass(frozen=True)
class SpecialTokens:
    cls: int
    sep: int
    pad: int
    mask: int

    @classmethod
    def of(cls, tokenizer) -> "SpecialTokens":
        return cls(tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id, tokenizer.mask_token_id)

    @property
    def ids(self) -> tuple[int, ...]:
        return self.cls, self.sep, self.pad


def masked_lm_parts(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(backbone, LM head) of a BERT or ELECTRA masked-LM model, so logits can be computed where needed."""
    if hasattr(model, "bert") and hasattr(model, "cls"):
        return model.bert, model.cls
    if hasattr(model, "electra") and hasattr(model, "generator_lm_head"):
        head = nn.Sequential(model.generator_predictions, model.generator_lm_head)
        return model.electra, head
    raise ValueError(f"{type(model).__name__}: pre-training needs a BERT or ELECTRA masked-LM model")


def lm_head_parts(head: nn.Module) -> tuple[nn.Module, nn.Linear]:
    """(transform, vocabulary projection) of a masked-LM head from :func:`masked_lm_parts`: BERT's
    ``cls.predictions`` (dense + GELU + LayerNorm, then the decoder tied to the word embeddings) or ELECTRA's
    generator head (``generator_predictions``, then ``generator_lm_head``)."""
    if hasattr(head, "predictions"):
        return head.predictions.transform, head.predictions.decoder
    if isinstance(head, nn.Sequential) and len(head) == 2:
        return head[0], head[1]
    raise ValueError(f"{type(head).__name__}: not a BERT or ELECTRA masked-LM head")


def lm_loss_sum(head: nn.Module, states: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Σ cross-entropy of ``head``'s prediction from each row of ``states`` [N, H] against ``targets`` [N]:
    the value of ``F.cross_entropy(head(states).float(), targets, reduction="sum")``, computed without the
    [N, vocabulary] logits (:func:`~dpr_pipeline.training.losses.linear_cross_entropy_sum`). Pass only the rows that
    are predicted: the head runs on those alone."""
    transform, projection = lm_head_parts(head)
    return linear_cross_entropy_sum(transform(states), projection.weight, projection.bias, targets)


def attention_bias(allowed: torch.Tensor, config) -> torch.Tensor:
    """``allowed`` [B, 1, Lq, Lk] (True = may attend) in the form the layers' attention implementation takes."""
    if config._attn_implementation == "eager":
        return torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return allowed


def backbone_inputs(input_ids: torch.Tensor, layout: torch.Tensor | PackedBatch, config) -> dict:
    """A backbone's keyword arguments for ``input_ids`` in the batch's ``layout``: a [B, L] padding mask, or a
    :class:`PackedBatch` (``input_ids`` [1, T]: the texts' real tokens, their positions and boundaries). The padding
    mask goes in as the [B, 1, 1, L] mask the layers take (:func:`attention_bias`): given the 2-D mask, transformers
    reads it on the host to see whether it may skip it, a wait for the device's queued work at every pass."""
    if isinstance(layout, PackedBatch):
        return {**layout.model_inputs(), "input_ids": input_ids}
    return {"input_ids": input_ids, "attention_mask": attention_bias(layout.bool()[:, None, None, :], config)}


def token_rows(tokens: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Positions ``rows`` (flat indices into [B, L]) of ``tokens`` [B, L] or [B, L, H]: an index list whose length
    the host knows, so unlike a boolean mask's selection the result's size needs no wait on the device."""
    return tokens.flatten(0, 1).index_select(0, rows)


def waits_on_selection(device: torch.device) -> bool:
    """Whether selecting rows by a mask computed on ``device`` makes the host wait (the result's size must come
    back from an accelerator); on a CPU it does not, and the selection is the cheaper way."""
    return device.type != "cpu"


def mask_rows(mask: torch.Tensor) -> torch.Tensor:
    """The flat indices of ``mask``'s True positions (on a GPU this waits for the device: build them on the host,
    as the collator does for ``content_rows``, where a step runs often)."""
    return mask.flatten().nonzero().squeeze(1)


def local_causal_mask(length: int, span: int, device=None) -> torch.Tensor:
    """[L, L] bool: position j may attend to position 0 (the bottleneck) and to positions j−span+1 … j, i.e.
    when predicting token j+1, exactly the ``span`` previous tokens (fewer at the start)."""
    rows = torch.arange(length, device=device)[:, None]
    cols = torch.arange(length, device=device)[None, :]
    return (cols == 0) | ((cols <= rows) & (cols > rows - span))


class TokenGenerator(nn.Module):
    """ELECTRA-style generator: predicts masked tokens; frozen (SimLM's choice) or trained jointly by MLM."""

    def __init__(self, model: nn.Module, trainable: bool):
        super().__init__()
        self.model = model
        self.trainable = trainable
        self.backbone, self.head = masked_lm_parts(model)
        if not trainable:
            model.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        if not self.trainable:
            self.model.eval()  # a frozen generator samples without dropout
        return self

    def replace(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor,
                mask_token_id: int, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Sample(g, Mask(x, ·)): the masked positions hold samples from g; plus g's MLM loss when trained.

        g's head runs on ``rows`` (flat indices into [B, L] that contain every masked position: the batch's
        content rows, whose number the host knows, so no step waits on the device; default: the masked positions
        themselves), its vocabulary projection in chunks that sample the replacements and score the loss from the
        same logits (:func:`linear_cross_entropy_and_samples`). A row outside the mask keeps its token and weighs
        0 in the loss."""
        transform, projection = lm_head_parts(self.head)
        rows = mask_rows(mask) if rows is None else rows
        context = contextlib.nullcontext() if self.trainable else torch.no_grad()
        with context:
            hidden = self.backbone(**backbone_inputs(input_ids.masked_fill(mask, mask_token_id), attention_mask,
                                                     self.backbone.config)).last_hidden_state
            states = transform(token_rows(hidden, rows))
            chosen, targets = token_rows(mask, rows), token_rows(input_ids, rows)
            draws = torch.rand(len(rows), device=states.device)
            loss_sum, sampled = linear_cross_entropy_and_samples(
                states, projection.weight, projection.bias, targets, draws, row_weights=chosen.to(states.dtype))
        replaced = input_ids.flatten().index_copy(0, rows, torch.where(chosen, sampled, targets))
        loss = loss_sum / chosen.sum().clamp(min=1) if self.trainable else None
        return replaced.view_as(input_ids), loss


def _masked_mean_lm(head: nn.Module, states: torch.Tensor, targets: torch.Tensor,
                    positions: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy of ``head`` over ``positions`` of ``states`` [B, L, H] (0 when there are none,
    with zero gradients for the head): the head runs on those positions only. ``positions``: a [B, L] boolean
    mask, or flat row indices into [B, L] (:func:`token_rows`: no wait on the device for the selection's size)."""
    if positions.dtype != torch.bool:
        count = max(1, len(positions))
        return lm_loss_sum(head, token_rows(states, positions), token_rows(targets, positions)) / count
    return lm_loss_sum(head, states[positions], targets[positions]) / positions.sum().clamp(min=1)


class PretrainingModel(nn.Module):
    """The encoder (a ``BertForMaskedLM``: BERT + LM head) and whatever its method declares; ``forward`` → the
    method's losses."""

    def __init__(self, masked_lm: nn.Module, settings: ObjectiveSettings, special: SpecialTokens,
                 generator: TokenGenerator | None = None):
        super().__init__()
        method = pretraining_method(settings.method)
        if (generator is None) == method.generator:
            raise ValueError(f"method {settings.method!r} {'needs' if generator is None else 'takes no'} generator")
        if settings.bottleneck not in POOLING_MODES:
            raise ValueError(f"bottleneck {settings.bottleneck!r}: use one of {POOLING_MODES}")
        self.method = method
        self.settings = settings
        self.special = special
        self.masked_lm = masked_lm
        self.encoder, self.lm_head = masked_lm_parts(masked_lm)
        self.generator = generator
        config = self.encoder.config
        self.vocab_size = config.vocab_size
        self.decoder = None if method.decoder is None else self._build_decoder(method.decoder)
        if method.decoder is not None and method.decoder.projection:
            self.projection = nn.Linear(config.hidden_size, config.hidden_size)
            self.projection.apply(masked_lm._init_weights)
        if method.replaced_token_head:
            # no token prediction: the LM head (but the word embeddings it shares) stays out of training, so DDP
            # finds no parameter without a gradient
            for parameter in self.lm_head.parameters():
                if parameter is not self.encoder.embeddings.word_embeddings.weight:
                    parameter.requires_grad_(False)
            self.rtd_head = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size), nn.GELU(),
                                          nn.Linear(config.hidden_size, 1))
            self.rtd_head.apply(masked_lm._init_weights)

    def _build_decoder(self, decoder: Decoder) -> nn.ModuleList:
        layers = self.encoder.encoder.layer
        depth = getattr(self.settings, decoder.depth)
        if decoder.reads_layer is not None:
            read = getattr(self.settings, decoder.reads_layer)
            if not 0 < read < len(layers):
                raise ValueError(f"{decoder.reads_layer} {read}: must lie between 1 and {len(layers) - 1} (the "
                                 f"encoder has {len(layers)} layers)")
        if not decoder.copied:
            return self._new_layers(depth)
        if depth > len(layers):
            raise ValueError(f"{decoder.depth} {depth} > the encoder's {len(layers)} layers")
        return nn.ModuleList(copy.deepcopy(layer) for layer in layers[len(layers) - depth:])

    def _new_layers(self, count: int) -> nn.ModuleList:
        layers = nn.ModuleList(BertLayer(self.encoder.config) for _ in range(count))
        layers.apply(self.masked_lm._init_weights)
        return layers

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        self.encoder.gradient_checkpointing_enable(**kwargs)

    def forward(self, input_ids, attention_mask, content, importance=None,
                content_rows=None) -> dict[str, torch.Tensor]:
        """The method's losses. ``attention_mask`` here and in the building blocks is the batch's layout: a [B, L]
        padding mask, or the collator's :class:`PackedBatch` (``input_ids``, ``content`` [1, T]: the texts' real
        tokens). ``content_rows``: ``content``'s flat indices (:func:`mask_rows`), made by the collator on the host
        (None: made here when the method reads them)."""
        return self.method.loss(self, input_ids, attention_mask, content, importance, content_rows)

    # -- building blocks of the methods' losses -----------------------------------------------------------------

    @staticmethod
    def content_rows(content: torch.Tensor, content_rows: torch.Tensor | None) -> torch.Tensor:
        """``content_rows`` as given (the collator's), else made from ``content`` (a wait on a GPU)."""
        return mask_rows(content) if content_rows is None else content_rows

    def bottleneck(self, states: torch.Tensor, attention_mask: torch.Tensor | PackedBatch) -> torch.Tensor:
        """The one vector per passage [B, H] the decoder or head reads from the encoder's last-layer ``states``:
        [CLS] (the papers'), or the mean over the real tokens (``bottleneck: mean``, the pooling of a
        sentence-transformers start such as MiniLM: the vector its retriever reads)."""
        if isinstance(attention_mask, PackedBatch):
            return pooled_rows(states[0], attention_mask, self.settings.bottleneck).to(states.dtype)
        if self.settings.bottleneck == "cls":
            return states[:, 0]
        return pool(states, attention_mask, "mean").to(states.dtype)

    def encode(self, input_ids, attention_mask, hidden_states: bool = False):
        return self.encoder(**backbone_inputs(input_ids, attention_mask, self.encoder.config),
                            output_hidden_states=hidden_states)

    def decode(self, bottleneck: torch.Tensor, token_states: torch.Tensor,
               allowed: torch.Tensor | PackedBatch) -> torch.Tensor:
        """Run the decoder on [bottleneck; token_states[:, 1:]]: the bottleneck replaces each text's position 0
        (``allowed``: :meth:`decoder_attention`'s)."""
        if isinstance(allowed, PackedBatch):
            hidden = token_states[0].index_copy(0, allowed.first_rows, bottleneck.to(token_states.dtype))[None]
            for layer in self.decoder:
                hidden = layer(hidden, **allowed.attention_kwargs())
            return hidden
        hidden = torch.cat([bottleneck.unsqueeze(1).to(token_states.dtype), token_states[:, 1:]], dim=1)
        bias = attention_bias(allowed, self.encoder.config)
        for layer in self.decoder:
            hidden = layer(hidden, attention_mask=bias)
        return hidden

    def decoder_embeddings(self, input_ids: torch.Tensor,
                           attention_mask: torch.Tensor | PackedBatch | None = None) -> torch.Tensor:
        """The decoder embeds its own input with the encoder's embedding layer (shared, as in SimLM)."""
        if isinstance(attention_mask, PackedBatch):
            return self.encoder.embeddings(input_ids=input_ids, position_ids=attention_mask.position_ids)
        return self.encoder.embeddings(input_ids=input_ids)

    @staticmethod
    def decoder_attention(attention_mask: torch.Tensor | PackedBatch,
                          causal_span: int | None = None) -> torch.Tensor | PackedBatch:
        """[B, 1, Lq, Lk] bool, what each decoder position may attend to: every real token, or with
        ``causal_span`` k only position 0 (the bottleneck) and the k previous tokens (:func:`local_causal_mask`).
        A packed batch: its texts' own tokens (the packed layout; a method with a causal span is not packed)."""
        if isinstance(attention_mask, PackedBatch):
            if causal_span is not None:
                raise ValueError("a decoder with a causal span reads padded batches (its method is not unpadded)")
            return attention_mask
        allowed = attention_mask.bool()[:, None, None, :]
        if causal_span is None:
            return allowed
        length = attention_mask.shape[1]
        return local_causal_mask(length, causal_span, attention_mask.device)[None, None] & allowed

    @staticmethod
    def mask(content: torch.Tensor, rate: float) -> torch.Tensor:
        """Mask(x, rate): each content position independently with probability ``rate``."""
        return random_mask(content, rate)

    def nested_masks(self, content: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """SimLM's (encoder mask at p_enc, decoder mask at p_dec containing it)."""
        s = self.settings
        enc_mask = random_mask(content, s.encoder_replace_rate)
        return enc_mask, nested_mask(enc_mask, content, s.encoder_replace_rate, s.decoder_replace_rate)

    def importance_mask(self, importance: torch.Tensor, content: torch.Tensor) -> torch.Tensor:
        """CDMAE's decoder mask at p_dec, high-importance tokens first (Algorithm 1, σ = ``cdmae_sigma``)."""
        s = self.settings
        return importance_aware_mask(importance, content, s.decoder_replace_rate, s.cdmae_sigma)

    def bert_mask(self, input_ids, mask):
        """BERT's 80/10/10 corruption of the ``mask`` positions."""
        return bert_corrupt(input_ids, mask, self.special.mask, self.vocab_size)

    def lm_loss(self, states: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Mean token cross-entropy of the LM head over ``positions`` (a [B, L] mask or flat rows) of ``states``."""
        return _masked_mean_lm(self.lm_head, states, targets, positions)

    def replaced_token_loss(self, states: torch.Tensor, corrupted: torch.Tensor, original: torch.Tensor,
                            content_rows: torch.Tensor) -> torch.Tensor:
        """ELECTRA's replaced-token detection over the content positions (flat rows; the method's ``rtd_head``)."""
        logits = at_least_float32(self.rtd_head(token_rows(states, content_rows)).squeeze(-1))
        return F.binary_cross_entropy_with_logits(logits, token_rows(corrupted != original, content_rows).float())

    def generator_inputs(self, input_ids, attention_mask, content, content_rows=None):
        """(x_enc, x_dec, encoder mask, decoder mask, {"generator": its MLM loss when trained}): the generator fills
        SimLM's nested masks. Its head runs on ``content_rows`` on an accelerator (no wait for the masked rows'
        number), on each mask's own rows on a CPU (nothing waits there, and 80 % of the rows instead of 200 %)."""
        enc_mask, dec_mask = self.nested_masks(content)
        content_rows = content_rows if waits_on_selection(input_ids.device) else None
        x_enc, gen_enc = self.generator.replace(input_ids, attention_mask, enc_mask, self.special.mask, content_rows)
        x_dec, gen_dec = self.generator.replace(input_ids, attention_mask, dec_mask, self.special.mask, content_rows)
        losses = {}
        if gen_enc is not None:
            losses["generator"] = (gen_enc + (gen_dec if gen_dec is not None else gen_enc)) / 2
        return x_enc, x_dec, enc_mask, dec_mask, losses

    def encoder_decoder(self, x_enc, x_dec, attention_mask):
        """(encoder token states, decoder token states) for the SimLM-style bottleneck."""
        encoded = self.encode(x_enc, attention_mask).last_hidden_state
        decoded = self.decode(self.bottleneck(encoded, attention_mask), self.decoder_embeddings(x_dec, attention_mask),
                              self.decoder_attention(attention_mask))
        return encoded, decoded

    def condenser_states(self, input_ids, attention_mask, content):
        """Condenser on an MLM-masked input: (late [CLS] vectors, head-loss sum, number of masked tokens)."""
        mask = self.mask(content, self.settings.encoder_replace_rate)
        out = self.encode(self.bert_mask(input_ids, mask), attention_mask, hidden_states=True)
        late_cls = self.bottleneck(out.last_hidden_state, attention_mask)
        early = out.hidden_states[self.settings.condenser_skip_layer]
        head = self.decode(late_cls, early, self.decoder_attention(attention_mask))
        return late_cls, lm_loss_sum(self.lm_head, head[mask], input_ids[mask]), mask.sum()


def compile_layers(model: nn.Module) -> int:
    """``torch.compile`` (inductor) every Transformer layer of ``model`` in place: the encoder's, the decoder's
    or head's, the generator's (transformers' ``GradientCheckpointingLayer``: ``BertLayer``, ``ElectraLayer``).
    Regional compilation: each layer's attention, GELU, dropout and LayerNorm become fused kernels, and layers of
    one shape share the compiled code; the loss code around them (boolean selections of predicted rows, the
    chunked vocabulary loss, sampling) keeps its data-dependent shapes in eager mode, where a whole-model graph
    would break. Parameter names, ``state_dict`` and checkpoints are those of the uncompiled model. Returns the
    number of layers compiled."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]
    for layer in layers:
        layer.compile()
    return len(layers)

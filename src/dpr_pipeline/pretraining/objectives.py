"""The pre-training objectives, one ``forward`` each, on a BERT encoder with its masked-LM head.

``method`` (config ``pretrain.method``) selects one; ``L`` is what the step minimises. "Content" positions are
real tokens other than [CLS]/[SEP]/padding (:func:`~dpr_pipeline.pretraining.masking.content_positions`).

================  =============================================================================================
``simlm``         simlm.md §3.1, Eq. 1–2. A generator g fills masked positions: x_enc = Sample(g, Mask(x, p_enc)),
                  x_dec = Sample(g, Mask(x, p_dec)), the decoder mask containing the encoder's. The encoder reads
                  x_enc; the decoder (``decoder_layers`` Transformer layers initialised from the encoder's last
                  ones) reads the encoder's last-layer [CLS] vector in place of its own [CLS] embedding,
                  followed by its own embeddings of x_dec — [CLS] is the only path between them. Both predict
                  the original token at every content position (the LM head is shared). L = L_enc + L_dec.
``enc_dec_mlm``   SimLM Table 7: the same encoder–decoder, [MASK]-corrupted inputs (BERT's 80/10/10) at the
                  same rates, loss on masked positions only.
``enc_dec_rtd``   SimLM Table 7: the same inputs as ``simlm``; encoder and decoder instead detect which
                  positions were replaced (ELECTRA's replaced-token detection, a shared binary head).
``autoencoder``   SimLM Table 7: the encoder reads the original text, the decoder only [MASK] tokens and
                  the [CLS] vector, and reconstructs every content token. L = L_dec.
``mlm``           SimLM Table 7: BERT's masked LM at ``encoder_replace_rate``, no decoder.
``condenser``     cocondenser.md Eq. 1–5: a head of ``condenser_head_layers`` new layers reads the late [CLS]
                  and the token states after layer ``condenser_skip_layer`` (the skip connection) and predicts
                  the masked tokens (MLM at ``encoder_replace_rate``, SimLM's Condenser setting). L = Eq. 5.
``cocondenser``   cocondenser.md Eq. 6–7: Condenser on two random spans of each passage plus the span-pair
                  contrastive loss over late [CLS] vectors; L = mean MLM + mean L_co. With
                  ``gradient_cache_chunk`` > 0 the step uses gradient caching (§3.3, Eq. 9–12).
``cdmae``         cdmae-challenging-decoder.md Eq. 1–9: encoder MLM at p_enc; the bottleneck is a linear
                  projection of [CLS] (Eq. 4); a decoder of ``decoder_layers`` randomly initialised layers
                  reconstructs a second masking at p_dec that masks high-AMI tokens first (Algorithm 1,
                  σ = ``cdmae_sigma``). L = L_enc + L_dec, each a mean over its masked tokens.
``seed_encoder``  seed-encoder.md Eq. 9: encoder MLM at p_enc plus a ``seed_decoder_layers``-layer
                  autoregressive decoder that reads only [CLS] and, for each next token, the previous
                  ``seed_attention_span`` tokens. L = L_MLM + L_dec.
================  =============================================================================================

The encoder alone (``model.encoder``) is what the retrievers start from.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.bert.modeling_bert import BertLayer

from ..losses import (at_least_float32, linear_cross_entropy_and_samples, linear_cross_entropy_sum,
                      span_contrastive_loss)
from .masking import bert_corrupt, nested_mask, random_mask
from .token_importance import importance_aware_mask

METHODS = ("simlm", "enc_dec_mlm", "enc_dec_rtd", "autoencoder", "mlm", "condenser", "cocondenser", "cdmae",
           "seed_encoder")
GENERATOR_METHODS = ("simlm", "enc_dec_rtd")


@dataclass(frozen=True)
class ObjectiveSettings:
    method: str = "simlm"
    encoder_replace_rate: float = 0.3
    decoder_replace_rate: float = 0.5
    decoder_layers: int = 2
    condenser_skip_layer: int = 6
    condenser_head_layers: int = 2
    gradient_cache_chunk: int = 0
    cdmae_sigma: float = 1.0
    seed_decoder_layers: int = 3
    seed_attention_span: int = 2

    @classmethod
    def from_params(cls, params: dict) -> "ObjectiveSettings":
        return cls(**{f.name: params[f.name] for f in fields(cls) if f.name in params})


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
    [N, vocabulary] logits (:func:`~dpr_pipeline.losses.linear_cross_entropy_sum`). Pass only the rows that
    are predicted: the head runs on those alone."""
    transform, projection = lm_head_parts(head)
    return linear_cross_entropy_sum(transform(states), projection.weight, projection.bias, targets)


def attention_bias(allowed: torch.Tensor, config) -> torch.Tensor:
    """``allowed`` [B, 1, Lq, Lk] (True = may attend) in the form the layers' attention implementation takes."""
    if config._attn_implementation == "eager":
        return torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return allowed


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
                mask_token_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Sample(g, Mask(x, ·)): the masked positions hold samples from g; plus g's MLM loss when trained.

        g's head runs on the masked rows only, and its vocabulary projection in chunks that sample the
        replacements and score the loss from the same logits (:func:`linear_cross_entropy_and_samples`)."""
        transform, projection = lm_head_parts(self.head)
        context = contextlib.nullcontext() if self.trainable else torch.no_grad()
        with context:
            hidden = self.backbone(input_ids=input_ids.masked_fill(mask, mask_token_id),
                                   attention_mask=attention_mask).last_hidden_state
            states = transform(hidden[mask])
            draws = torch.rand(len(states), device=states.device)
            loss_sum, sampled = linear_cross_entropy_and_samples(states, projection.weight, projection.bias,
                                                                 input_ids[mask], draws)
        replaced = input_ids.clone()
        replaced[mask] = sampled
        return replaced, loss_sum / len(states) if self.trainable and len(states) else None


def _masked_mean_lm(head: nn.Module, states: torch.Tensor, targets: torch.Tensor,
                    positions: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy of ``head`` over ``positions`` [B, L] of ``states`` [B, L, H] (0 when there are
    none, with zero gradients for the head): the head runs on those positions only."""
    return lm_loss_sum(head, states[positions], targets[positions]) / positions.sum().clamp(min=1)


class PretrainingModel(nn.Module):
    """The encoder (a ``BertForMaskedLM``: BERT + LM head) and whatever the method adds; ``forward`` → losses."""

    def __init__(self, masked_lm: nn.Module, settings: ObjectiveSettings, special: SpecialTokens,
                 generator: TokenGenerator | None = None):
        super().__init__()
        if settings.method not in METHODS:
            raise ValueError(f"pre-training method {settings.method!r}: use one of {METHODS}")
        if (generator is None) == (settings.method in GENERATOR_METHODS):
            raise ValueError(f"method {settings.method!r} {'needs' if generator is None else 'takes no'} generator")
        self.settings = settings
        self.special = special
        self.masked_lm = masked_lm
        self.encoder, self.lm_head = masked_lm_parts(masked_lm)
        self.generator = generator
        config = self.encoder.config
        self.vocab_size = config.vocab_size
        layers = self.encoder.encoder.layer
        method = settings.method
        if method in ("simlm", "enc_dec_mlm", "enc_dec_rtd", "autoencoder"):
            if settings.decoder_layers > len(layers):
                raise ValueError(f"decoder_layers {settings.decoder_layers} > the encoder's {len(layers)} layers")
            last = layers[len(layers) - settings.decoder_layers:]
            self.decoder = nn.ModuleList(copy.deepcopy(layer) for layer in last)
        elif method in ("condenser", "cocondenser"):
            if not 0 < settings.condenser_skip_layer < len(layers):
                raise ValueError(f"condenser_skip_layer {settings.condenser_skip_layer}: must lie between 1 and "
                                 f"{len(layers) - 1} (the encoder has {len(layers)} layers)")
            self.decoder = self._new_layers(settings.condenser_head_layers)
        elif method == "cdmae":
            self.decoder = self._new_layers(settings.decoder_layers)
            self.projection = nn.Linear(config.hidden_size, config.hidden_size)
            self.projection.apply(masked_lm._init_weights)
        elif method == "seed_encoder":
            self.decoder = self._new_layers(settings.seed_decoder_layers)
        else:
            self.decoder = None
        if method == "enc_dec_rtd":
            # no token prediction: the LM head (but the word embeddings it shares) stays out of training, so DDP
            # finds no parameter without a gradient
            for parameter in self.lm_head.parameters():
                if parameter is not self.encoder.embeddings.word_embeddings.weight:
                    parameter.requires_grad_(False)
            self.rtd_head = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size), nn.GELU(),
                                          nn.Linear(config.hidden_size, 1))
            self.rtd_head.apply(masked_lm._init_weights)

    def _new_layers(self, count: int) -> nn.ModuleList:
        layers = nn.ModuleList(BertLayer(self.encoder.config) for _ in range(count))
        layers.apply(self.masked_lm._init_weights)
        return layers

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        self.encoder.gradient_checkpointing_enable(**kwargs)

    # -- building blocks ----------------------------------------------------------------------------------------

    def _encode(self, input_ids, attention_mask, hidden_states: bool = False):
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=hidden_states)

    def decode(self, bottleneck: torch.Tensor, token_states: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """Run the decoder on [bottleneck; token_states[:, 1:]]: the bottleneck replaces position 0."""
        hidden = torch.cat([bottleneck.unsqueeze(1).to(token_states.dtype), token_states[:, 1:]], dim=1)
        bias = attention_bias(allowed, self.encoder.config)
        for layer in self.decoder:
            hidden = layer(hidden, attention_mask=bias)
        return hidden

    def _decoder_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The decoder embeds its own input with the encoder's embedding layer (shared, as in SimLM)."""
        return self.encoder.embeddings(input_ids=input_ids)

    @staticmethod
    def _key_padding(attention_mask: torch.Tensor) -> torch.Tensor:
        return attention_mask.bool()[:, None, None, :]

    def _bert_mask(self, input_ids, mask):
        return bert_corrupt(input_ids, mask, self.special.mask, self.vocab_size)

    # -- objectives ---------------------------------------------------------------------------------------------

    def forward(self, input_ids, attention_mask, content, importance=None) -> dict[str, torch.Tensor]:
        return getattr(self, f"_{self.settings.method}")(input_ids, attention_mask, content, importance)

    def _generator_inputs(self, input_ids, attention_mask, content):
        s = self.settings
        enc_mask = random_mask(content, s.encoder_replace_rate)
        dec_mask = nested_mask(enc_mask, content, s.encoder_replace_rate, s.decoder_replace_rate)
        x_enc, gen_enc = self.generator.replace(input_ids, attention_mask, enc_mask, self.special.mask)
        x_dec, gen_dec = self.generator.replace(input_ids, attention_mask, dec_mask, self.special.mask)
        losses = {}
        if gen_enc is not None:
            losses["generator"] = (gen_enc + (gen_dec if gen_dec is not None else gen_enc)) / 2
        return x_enc, x_dec, enc_mask, dec_mask, losses

    def _encoder_decoder(self, x_enc, x_dec, attention_mask):
        """(encoder token states, decoder token states) for the SimLM-style bottleneck."""
        encoded = self._encode(x_enc, attention_mask).last_hidden_state
        decoded = self.decode(encoded[:, 0], self._decoder_embeddings(x_dec), self._key_padding(attention_mask))
        return encoded, decoded

    @staticmethod
    def _total(losses: dict) -> dict:
        losses["loss"] = sum(losses.values())
        return losses

    def _simlm(self, input_ids, attention_mask, content, importance):
        x_enc, x_dec, _, _, losses = self._generator_inputs(input_ids, attention_mask, content)
        encoded, decoded = self._encoder_decoder(x_enc, x_dec, attention_mask)
        losses["encoder"] = _masked_mean_lm(self.lm_head, encoded, input_ids, content)
        losses["decoder"] = _masked_mean_lm(self.lm_head, decoded, input_ids, content)
        return self._total(losses)

    def _enc_dec_rtd(self, input_ids, attention_mask, content, importance):
        x_enc, x_dec, _, _, losses = self._generator_inputs(input_ids, attention_mask, content)
        encoded, decoded = self._encoder_decoder(x_enc, x_dec, attention_mask)
        for name, states, corrupted in (("encoder", encoded, x_enc), ("decoder", decoded, x_dec)):
            logits = at_least_float32(self.rtd_head(states[content]).squeeze(-1))
            losses[name] = F.binary_cross_entropy_with_logits(logits, (corrupted != input_ids)[content].float())
        return self._total(losses)

    def _enc_dec_mlm(self, input_ids, attention_mask, content, importance):
        s = self.settings
        enc_mask = random_mask(content, s.encoder_replace_rate)
        dec_mask = nested_mask(enc_mask, content, s.encoder_replace_rate, s.decoder_replace_rate)
        encoded, decoded = self._encoder_decoder(self._bert_mask(input_ids, enc_mask),
                                                 self._bert_mask(input_ids, dec_mask), attention_mask)
        return self._total({"encoder": _masked_mean_lm(self.lm_head, encoded, input_ids, enc_mask),
                            "decoder": _masked_mean_lm(self.lm_head, decoded, input_ids, dec_mask)})

    def _autoencoder(self, input_ids, attention_mask, content, importance):
        blank = input_ids.masked_fill(content, self.special.mask)
        _, decoded = self._encoder_decoder(input_ids, blank, attention_mask)
        return self._total({"decoder": _masked_mean_lm(self.lm_head, decoded, input_ids, content)})

    def _mlm(self, input_ids, attention_mask, content, importance):
        mask = random_mask(content, self.settings.encoder_replace_rate)
        encoded = self._encode(self._bert_mask(input_ids, mask), attention_mask).last_hidden_state
        return self._total({"encoder": _masked_mean_lm(self.lm_head, encoded, input_ids, mask)})

    def condenser_states(self, input_ids, attention_mask, content):
        """Condenser on an MLM-masked input: (late [CLS] vectors, head-loss sum, number of masked tokens)."""
        mask = random_mask(content, self.settings.encoder_replace_rate)
        out = self._encode(self._bert_mask(input_ids, mask), attention_mask, hidden_states=True)
        late_cls = out.last_hidden_state[:, 0]
        early = out.hidden_states[self.settings.condenser_skip_layer]
        head = self.decode(late_cls, early, self._key_padding(attention_mask))
        return late_cls, lm_loss_sum(self.lm_head, head[mask], input_ids[mask]), mask.sum()

    def _condenser(self, input_ids, attention_mask, content, importance):
        _, loss_sum, count = self.condenser_states(input_ids, attention_mask, content)
        return self._total({"head": loss_sum / count.clamp(min=1)})

    def _cocondenser(self, input_ids, attention_mask, content, importance):
        """Without gradient caching (the step function handles cross-device negatives and caching)."""
        late_cls, loss_sum, count = self.condenser_states(input_ids, attention_mask, content)
        return {"cls": late_cls, "mlm_sum": loss_sum, "masked": count}

    def _cdmae(self, input_ids, attention_mask, content, importance):
        s = self.settings
        enc_mask = random_mask(content, s.encoder_replace_rate)
        dec_mask = importance_aware_mask(importance, content, s.decoder_replace_rate, s.cdmae_sigma)
        encoded = self._encode(self._bert_mask(input_ids, enc_mask), attention_mask).last_hidden_state
        bottleneck = self.projection(encoded[:, 0])
        decoded = self.decode(bottleneck, self._decoder_embeddings(self._bert_mask(input_ids, dec_mask)),
                              self._key_padding(attention_mask))
        return self._total({"encoder": _masked_mean_lm(self.lm_head, encoded, input_ids, enc_mask),
                            "decoder": _masked_mean_lm(self.lm_head, decoded, input_ids, dec_mask)})

    def _seed_encoder(self, input_ids, attention_mask, content, importance):
        mask = random_mask(content, self.settings.encoder_replace_rate)
        encoded = self._encode(self._bert_mask(input_ids, mask), attention_mask).last_hidden_state
        length = input_ids.shape[1]
        allowed = local_causal_mask(length, self.settings.seed_attention_span, input_ids.device)[None, None]
        decoded = self.decode(encoded[:, 0], self._decoder_embeddings(input_ids),
                              allowed & self._key_padding(attention_mask))
        # position j predicts token j + 1 from [CLS] and tokens j−k+1 … j
        return self._total({"encoder": _masked_mean_lm(self.lm_head, encoded, input_ids, mask),
                            "decoder": _masked_mean_lm(self.lm_head, decoded[:, :-1], input_ids[:, 1:],
                                                       content[:, 1:])})


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


def _no_sync(model: nn.Module, last: bool):
    return model.no_sync() if hasattr(model, "no_sync") and not last else contextlib.nullcontext()


def cocondenser_step(chunk_size: int):
    """coCondenser's step (Eq. 7): mean Condenser MLM + mean span contrastive loss over the global batch of
    span pairs (vectors gathered across processes). It back-propagates itself and returns the loss detached.

    ``chunk_size`` > 0: gradient caching (§3.3). A no-grad pass computes every span's [CLS] vector; the
    contrastive loss's gradient with respect to those vectors (Eq. 9) is cached; then each chunk of
    ``chunk_size`` spans is run again with gradients and back-propagates v·h + its MLM share (Eq. 12), so
    only one chunk's activations are held at a time. The RNG state is replayed so that both passes draw the
    same masks and dropout. The gradient equals the one-pass gradient.
    """

    def compute_loss(model, batch: dict, dist) -> torch.Tensor:
        inputs = (batch["input_ids"], batch["attention_mask"], batch["content"])
        scale = dist.world_size  # DDP averages over processes; the global contrastive loss needs their sum
        if chunk_size <= 0 or chunk_size >= len(inputs[0]):
            out = model(*inputs)
            mlm = out["mlm_sum"] / out["masked"].clamp(min=1)
            contrastive = span_contrastive_loss(dist.gather(out["cls"]))
            (mlm + scale * contrastive).backward()
            return (mlm + contrastive).detach()
        chunks = [slice(i, i + chunk_size) for i in range(0, len(inputs[0]), chunk_size)]
        devices = [inputs[0].device] if inputs[0].device.type == "cuda" else []
        states, vectors, masked = [], [], 0
        with torch.no_grad():
            for part in chunks:
                states.append((torch.get_rng_state(), torch.cuda.get_rng_state(devices[0]) if devices else None))
                out = model(*(x[part] for x in inputs))
                vectors.append(out["cls"])
                masked += int(out["masked"])
        cached = at_least_float32(torch.cat(vectors)).requires_grad_()
        contrastive = span_contrastive_loss(dist.gather(cached))
        contrastive.backward()
        masked = max(masked, 1)
        mlm = 0.0
        for index, (part, (cpu_state, cuda_state)) in enumerate(zip(chunks, states)):
            torch.set_rng_state(cpu_state)  # the same masks and dropout as in the first pass
            if cuda_state is not None:
                torch.cuda.set_rng_state(cuda_state, devices[0])
            with _no_sync(model, last=index == len(chunks) - 1):
                out = model(*(x[part] for x in inputs))
                (scale * (at_least_float32(out["cls"]) * cached.grad[part]).sum() + out["mlm_sum"] / masked).backward()
            mlm += out["mlm_sum"].item() / masked
        return (contrastive + mlm).detach()

    return compute_loss

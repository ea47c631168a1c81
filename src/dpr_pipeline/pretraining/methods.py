"""The pre-training methods, each declared once: what it needs and how its loss is made.

A :class:`PretrainingMethod` says what the method needs (a generator, a decoder, a replaced-token head, token
importance from corpus n-gram counts, span pairs) and how it steps; its ``loss`` is written in the building
blocks of :class:`~dpr_pipeline.pretraining.objectives.PretrainingModel`. The rule (``rules/pretrain.smk``),
the job's adapter, the trainer (``train.py``), the model (``objectives.py``) and the throughput benchmark ask
the method; none compares names. ``METHODS`` is the registry; the schema's lists of methods are tested against
it (``tests/test_pretraining_methods.py``). This module imports no torch: Snakemake reads it when it plans.

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

#: ``pretrain.generator: random``: a small BERT trained jointly instead of a pre-trained generator.
RANDOM_GENERATOR = "random"

# loss(model: PretrainingModel, input_ids, attention_mask, content, importance, content_rows) -> named tensors
Loss = Callable[..., dict]
# step(model, batch, dist) -> the batch's loss, as the trainer calls it (training/trainer.py)
Step = Callable[..., object]


@dataclass(frozen=True)
class ObjectiveSettings:
    """The pre-training settings (config ``pretrain``) the methods read; ``method`` names the one that runs."""

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
    bottleneck: str = "auto"  # the vector the decoder or head reads: cls, mean or auto (resolved by the trainer)


@dataclass(frozen=True)
class Decoder:
    """The layers a method adds after the encoder: they read a bottleneck vector in place of position 0
    (:meth:`~dpr_pipeline.pretraining.objectives.PretrainingModel.decode`)."""

    depth: str  # the pre-training setting that gives its number of layers
    copied: bool = False  # initialised from the encoder's last layers (SimLM), else new, randomly initialised
    reads_layer: str | None = None  # the setting naming the early encoder layer it reads (Condenser's skip)
    projection: bool = False  # the bottleneck is a linear projection of [CLS] (CDMAE Eq. 4), not [CLS] itself

    @property
    def settings(self) -> tuple[str, ...]:
        """The pre-training settings this decoder reads."""
        return (self.depth,) if self.reads_layer is None else (self.depth, self.reads_layer)


@dataclass(frozen=True)
class PretrainingMethod:
    """One pre-training method: what it needs and how it steps. ``loss`` returns named tensors, ``loss`` among
    them unless the method's own ``step`` combines them."""

    name: str
    loss: Loss
    generator: bool = False  # an ELECTRA-style generator fills the masked positions (train.build_generator)
    decoder: Decoder | None = None
    replaced_token_head: bool = False  # ELECTRA's binary head; the LM head (but the embeddings) stays frozen
    ngram_counts: bool = False  # token importance from the corpus n-gram counts (rule count_ngrams), per batch
    span_pairs: bool = False  # each example is two random spans of a passage, contrasted in the batch
    step: Callable[[ObjectiveSettings], Step] | None = None  # its own step; None: minimise ``loss``'s "loss"
    # its loss reads each text's real tokens only (models/packing.py: batches unpadded); False where it reads the
    # padded [B, L] layout itself: per-text mask counts, a local causal decoder over shifted targets, span slices
    unpadded: bool = True

    def negatives(self, batch_size: int) -> dict | None:
        """What the job's manifest records as negatives: with span pairs, each span against the other 2B − 2
        spans of the global batch (coCondenser Eq. 6); none otherwise."""
        if not self.span_pairs:
            return None
        return {"in_batch": True, "batch_size": batch_size, "effective_per_query": 2 * batch_size - 2}


def _total(losses: dict) -> dict:
    losses["loss"] = sum(losses.values())
    return losses


# -- the losses, in PretrainingModel's building blocks ----------------------------------------------------------


def _simlm(model, input_ids, attention_mask, content, importance, rows):
    rows = model.content_rows(content, rows)
    x_enc, x_dec, _, _, losses = model.generator_inputs(input_ids, attention_mask, content, rows)
    encoded, decoded = model.encoder_decoder(x_enc, x_dec, attention_mask)
    losses["encoder"] = model.lm_loss(encoded, input_ids, rows)
    losses["decoder"] = model.lm_loss(decoded, input_ids, rows)
    return _total(losses)


def _enc_dec_mlm(model, input_ids, attention_mask, content, importance, rows):
    enc_mask, dec_mask = model.nested_masks(content)
    encoded, decoded = model.encoder_decoder(model.bert_mask(input_ids, enc_mask),
                                             model.bert_mask(input_ids, dec_mask), attention_mask)
    return _total({"encoder": model.lm_loss(encoded, input_ids, enc_mask),
                   "decoder": model.lm_loss(decoded, input_ids, dec_mask)})


def _enc_dec_rtd(model, input_ids, attention_mask, content, importance, rows):
    rows = model.content_rows(content, rows)
    x_enc, x_dec, _, _, losses = model.generator_inputs(input_ids, attention_mask, content, rows)
    encoded, decoded = model.encoder_decoder(x_enc, x_dec, attention_mask)
    losses["encoder"] = model.replaced_token_loss(encoded, x_enc, input_ids, rows)
    losses["decoder"] = model.replaced_token_loss(decoded, x_dec, input_ids, rows)
    return _total(losses)


def _autoencoder(model, input_ids, attention_mask, content, importance, rows):
    rows = model.content_rows(content, rows)
    blank = input_ids.masked_fill(content, model.special.mask)
    _, decoded = model.encoder_decoder(input_ids, blank, attention_mask)
    return _total({"decoder": model.lm_loss(decoded, input_ids, rows)})


def _mlm(model, input_ids, attention_mask, content, importance, rows):
    mask = model.mask(content, model.settings.encoder_replace_rate)
    encoded = model.encode(model.bert_mask(input_ids, mask), attention_mask).last_hidden_state
    return _total({"encoder": model.lm_loss(encoded, input_ids, mask)})


def _condenser(model, input_ids, attention_mask, content, importance, rows):
    _, loss_sum, count = model.condenser_states(input_ids, attention_mask, content)
    return _total({"head": loss_sum / count.clamp(min=1)})


def _cocondenser(model, input_ids, attention_mask, content, importance, rows):
    """The parts its step combines (the step handles cross-device negatives and gradient caching)."""
    late_cls, loss_sum, count = model.condenser_states(input_ids, attention_mask, content)
    return {"cls": late_cls, "mlm_sum": loss_sum, "masked": count}


def _span_contrast_step(settings: ObjectiveSettings) -> Step:
    from dpr_pipeline.pretraining.span_contrast import cocondenser_step  # heavy: torch (read when Snakemake plans)

    return cocondenser_step(settings.gradient_cache_chunk)


def _cdmae(model, input_ids, attention_mask, content, importance, rows):
    enc_mask = model.mask(content, model.settings.encoder_replace_rate)
    dec_mask = model.importance_mask(importance, content)
    encoded = model.encode(model.bert_mask(input_ids, enc_mask), attention_mask).last_hidden_state
    bottleneck = model.projection(model.bottleneck(encoded, attention_mask))
    decoded = model.decode(bottleneck,
                           model.decoder_embeddings(model.bert_mask(input_ids, dec_mask), attention_mask),
                           model.decoder_attention(attention_mask))
    return _total({"encoder": model.lm_loss(encoded, input_ids, enc_mask),
                   "decoder": model.lm_loss(decoded, input_ids, dec_mask)})


def _seed_encoder(model, input_ids, attention_mask, content, importance, rows):
    mask = model.mask(content, model.settings.encoder_replace_rate)
    encoded = model.encode(model.bert_mask(input_ids, mask), attention_mask).last_hidden_state
    decoded = model.decode(model.bottleneck(encoded, attention_mask),
                           model.decoder_embeddings(input_ids, attention_mask),
                           model.decoder_attention(attention_mask, causal_span=model.settings.seed_attention_span))
    # position j predicts token j + 1 from [CLS] and tokens j−k+1 … j
    return _total({"encoder": model.lm_loss(encoded, input_ids, mask),
                   "decoder": model.lm_loss(decoded[:, :-1], input_ids[:, 1:], content[:, 1:])})


_SIMLM_DECODER = Decoder("decoder_layers", copied=True)
_CONDENSER_HEAD = Decoder("condenser_head_layers", reads_layer="condenser_skip_layer")

# In the schema's order (schemas/config.schema.yaml: pretrain.method, pretrain.ablation_methods, transfer.stages)
METHODS: dict[str, PretrainingMethod] = {method.name: method for method in (
    PretrainingMethod("simlm", _simlm, generator=True, decoder=_SIMLM_DECODER),
    PretrainingMethod("enc_dec_mlm", _enc_dec_mlm, decoder=_SIMLM_DECODER),
    PretrainingMethod("enc_dec_rtd", _enc_dec_rtd, generator=True, decoder=_SIMLM_DECODER, replaced_token_head=True),
    PretrainingMethod("autoencoder", _autoencoder, decoder=_SIMLM_DECODER),
    PretrainingMethod("mlm", _mlm),
    PretrainingMethod("condenser", _condenser, decoder=_CONDENSER_HEAD),
    PretrainingMethod("cocondenser", _cocondenser, decoder=_CONDENSER_HEAD, span_pairs=True,
                      step=_span_contrast_step, unpadded=False),
    PretrainingMethod("cdmae", _cdmae, decoder=Decoder("decoder_layers", projection=True), ngram_counts=True,
                      unpadded=False),
    PretrainingMethod("seed_encoder", _seed_encoder, decoder=Decoder("seed_decoder_layers"), unpadded=False),
)}


def pretraining_method(name: str) -> PretrainingMethod:
    """The method called ``name`` (config ``pretrain.method``, the ``{method}`` of ``pretrain/{method}``)."""
    if name not in METHODS:
        raise ValueError(f"pre-training method {name!r}: use one of {tuple(METHODS)}")
    return METHODS[name]

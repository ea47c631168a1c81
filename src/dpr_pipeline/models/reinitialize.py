"""A start that is part language model, part untrained: the top Transformer layers of an encoder drawn anew as
BERT draws them, the embeddings and the lower layers kept (docs/pretraining.md, "The ablation on the bundled
SciFact"). It is how pre-training can be read on a start that is already a sentence embedder: the re-drawn layers
are what the pre-training methods have to fill, as they fill a whole BERT in the papers."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.errors import ConfigError
from dpr_pipeline.models.embedding import load_text_encoder, save_text_encoder
from dpr_pipeline.models.loading import load_tokenizer

log = logging.getLogger(__name__)


def reinitialize_top_layers(transformer: torch.nn.Module, layers: int, seed: int) -> None:
    """Draw the top ``layers`` Transformer layers of a BERT-architecture ``transformer`` anew, in place: every
    linear weight from N(0, ``config.initializer_range``), its bias 0, every LayerNorm's weight 1 and bias 0 (BERT's
    own initialisation), in module order from a generator seeded with ``seed``; nothing else changes. A count the
    encoder does not have is a ConfigError (the job's one message: run_errors), not a bug's traceback."""
    stack = transformer.encoder.layer
    if not 0 < layers <= len(stack):
        raise ConfigError(f"pretrain.reinitialize_layers: {layers}: cannot re-initialise the top {layers} layers of "
                          f"a {len(stack)}-layer encoder. Fix: choose 1 to {len(stack)}, or 0 to keep the plm as it is")
    std = transformer.config.initializer_range
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in stack[len(stack) - layers:]:
            for module in layer.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.copy_(torch.empty_like(module.weight).normal_(0.0, std, generator=generator))
                    module.bias.zero_()
                elif isinstance(module, torch.nn.LayerNorm):
                    module.weight.fill_(1.0)
                    module.bias.zero_()


def write_reinitialized_start(plm: str, layers: int, seed: int, output_dir: str | Path, max_length: int) -> None:
    """``plm`` (any model reference) with its top ``layers`` drawn anew (:func:`reinitialize_top_layers`), saved as
    a model folder at ``output_dir`` (its pooling and prompts kept, ``max_length`` its passage length), whole or not
    at all."""
    encoder = load_text_encoder(plm)
    reinitialize_top_layers(encoder.transformer, layers, seed)
    with atomic_output(output_dir) as tmp:
        save_text_encoder(encoder, load_tokenizer(plm), tmp, max_length)
    log.info("%s: %s with its top %d of %d layers drawn anew (seed %d)", output_dir, plm, layers,
             len(encoder.transformer.encoder.layer), seed)

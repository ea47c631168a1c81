"""Hugging Face Hub models fetched before the jobs that load them, so that those jobs run with the Hub offline
(compute nodes without internet; docs/cluster.md, "Models").

A model setting given as a Hub name (``bert-base-uncased``, ``google/electra-base-generator``: any ``plm``,
``pretrain.generator``; :func:`dpr_pipeline.models.refs.is_hub_name`) is fetched by a fetch job (rules/fetch.smk,
``fetch_model_<name>``, a local rule: on the host Snakemake runs on, never a compute node) into its own folder,
:func:`dpr_pipeline.layout.fetched_model_dir` (``<fetch.models>/<org>--<name>``), shared by every dataset that
names it. :func:`fetch_model` downloads only the files a model needs (config, weights in safetensors where the
repository has them, tokenizer and sentence-transformers files) with huggingface_hub's ``snapshot_download``,
checks each weight file's sha256 against the Hub's record, and writes :data:`MANIFEST` last: the repository,
the revision asked for, the commit it resolved to, and each file's size and sha256 (as the data fetches record
theirs). The folder appears under its name only when complete (it is downloaded into ``<folder>.part``, which a
killed job's rerun continues); a folder already there is used as it is (no job, no network).

The jobs get the folder instead of the Hub name (:func:`model_source`, through
:mod:`dpr_pipeline.orchestration.stage_settings`), take it as an input (so the fetch runs first), and load it with
``HF_HUB_OFFLINE=1`` (workflow_scripts/_hub_offline.py). Loading a fetched folder checks it against its manifest
(:func:`verify_fetched_model`, called by :func:`dpr_pipeline.models.refs.resolve_model_path`): a missing or
changed file is one DataError naming it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

from dpr_pipeline.data.download import file_hash
from dpr_pipeline.errors import FetchError
from dpr_pipeline.models.refs import FETCH_MANIFEST as MANIFEST
from dpr_pipeline.models.refs import is_hub_name, verify_fetched_model
from dpr_pipeline.layout import fetched_model_dir

log = logging.getLogger(__name__)

# MANIFEST: the fetched folder's record of what it holds, written last.
#: Top-level files a model may need besides its weights: its config, the tokenizer's files, sentence-transformers'
#: description of its modules and prompts.
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt",
               "spiece.model", "sentencepiece.bpe.model", "tokenizer.model", "modules.json",
               "config_sentence_transformers.json", "sentence_bert_config.json")
#: Weight files, safetensors preferred: the first kind a folder (the top level, a sentence-transformers module)
#: has is the one fetched.
WEIGHT_KINDS = (re.compile(r"model(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json"),
                re.compile(r"pytorch_model(-\d+-of-\d+)?\.bin|pytorch_model\.bin\.index\.json"))
#: A sentence-transformers module folder (``1_Pooling``, ``2_Dense``): its JSON files and weights.
MODULE_FOLDER = re.compile(r"\d+_[A-Za-z]\w*")


# ------------------------------------------------------------------------------------------ config side
def fetched_folder(config: dict, reference: str) -> str | None:
    """The folder a model reference is fetched into when it is a Hub name (``fetch.models``, pinned at
    ``fetch.revisions[reference]``), else None (``pkg:``, a folder, a path)."""
    if not is_hub_name(reference):
        return None
    fetch = config["fetch"]
    return fetched_model_dir(fetch["models"], reference, fetch["revisions"].get(reference))


def model_source(config: dict, reference: str) -> str:
    """What a job loads for a model reference: the fetched folder of a Hub name, any other reference as it is."""
    return fetched_folder(config, reference) or reference


def is_fetched(config: dict, path: str) -> bool:
    """Whether ``path`` (a job's model) is a fetched Hub model's folder, which the job takes as an input."""
    return Path(path).parent == Path(config["fetch"]["models"])


# -------------------------------------------------------------------------------------------- fetching
def model_files(names: list[str]) -> list[str]:
    """The files of a repository (its file names) that a model folder needs: :data:`MODEL_FILES` and the
    weights (:data:`WEIGHT_KINDS`, safetensors preferred) at the top level and in each sentence-transformers
    module folder; no other framework's weights, no ONNX or OpenVINO exports, no README."""
    by_folder: dict[str, list[str]] = {}
    for name in names:
        folder, _, base = name.rpartition("/")
        if folder == "" or (MODULE_FOLDER.fullmatch(folder) and "/" not in folder):
            by_folder.setdefault(folder, []).append(base)
    chosen = []
    for folder, bases in by_folder.items():
        prefix = f"{folder}/" if folder else ""
        wanted = [b for b in bases if b in MODEL_FILES or (folder and b.endswith(".json"))]
        for kind in WEIGHT_KINDS:
            weights = [b for b in bases if kind.fullmatch(b)]
            if weights:
                wanted += weights
                break
        chosen += [prefix + b for b in sorted(wanted)]
    return chosen


def fetch_model(repo_id: str, folder: str | Path, *, revision: str | None = None,
                endpoint: str | None = None) -> dict:
    """Fetch the Hub model ``repo_id`` (at ``revision``, else ``main``) into ``folder`` and return its manifest.

    A folder with a manifest is checked against it (:func:`verify_fetched_model`) and used as it is, without the
    network. Otherwise the files :func:`model_files` picks are downloaded into ``<folder>.part`` (continued
    where a killed job stopped), each weight file's sha256 checked against the Hub's record, the manifest
    written, and the folder renamed into place. A model the Hub does not have, a revision it lacks, a repository
    without a model's files, or a failed download is one :class:`FetchError` naming the folder and the fix.
    ``endpoint``: the Hub's address (default: ``HF_ENDPOINT`` or huggingface.co).
    """
    folder = Path(folder)
    if (folder / MANIFEST).is_file():
        manifest = verify_fetched_model(folder)
        log.info("%s: already fetched (%s at commit %s); not downloading", folder, repo_id, manifest["commit"])
        return manifest
    if folder.exists():
        raise FetchError(folder, f"the folder exists but has no {MANIFEST}, so it is not a complete fetch of "
                         f"{repo_id}", f"delete {folder} (or move it away and point the setting at it), then rerun")
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    part = folder.with_name(folder.name + ".part")
    asked = revision or "main"
    log.info("fetching %s (revision %s) from %s into %s", repo_id, asked, where, folder)
    try:
        info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, files_metadata=True)
        hub_files = {s.rfilename: s for s in info.siblings or []}
        files = model_files(list(hub_files))
        if "config.json" not in files and "modules.json" not in files:
            raise FetchError(folder, f"the Hub repository {repo_id} (commit {info.sha}) has neither config.json nor "
                             f"modules.json, so it is not a model transformers loads (its files: "
                             f"{sorted(hub_files)[:12]})", "name another model in the config")
        snapshot_download(repo_id, revision=info.sha, local_dir=part, allow_patterns=files, endpoint=endpoint)
    except (RepositoryNotFoundError, GatedRepoError) as err:
        gated = isinstance(err, GatedRepoError)
        raise FetchError(folder, f"the Hub at {where} has no model {repo_id!r}" + (" you may read (gated)" if gated
                         else " (or it is private)"), "check the Hub name in the config (the page "
                         f"{where}/{repo_id} must exist); a private or gated model needs a token on the host that "
                         "fetches (`hf auth login`, or HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise FetchError(folder, f"the Hub model {repo_id} has no revision {asked!r}",
                         f"set fetch.revisions.{repo_id} in the config to one it has (a branch, tag or commit "
                         f"of {where}/{repo_id})") from None
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FetchError(folder, f"fetching {repo_id} from {where} failed ({type(err).__name__}: {reason})",
                         "check that this host reaches the Hub (compute nodes without internet: `fetch: {local: "
                         "true}` runs the fetch jobs where snakemake runs, docs/cluster.md), then rerun: the "
                         f"partial download in {part} is continued") from None
    shutil.rmtree(part / ".cache", ignore_errors=True)     # huggingface_hub's download records, not the model's
    entries = {}
    for name in files:
        path = part / name
        sha256 = file_hash(path, "sha256")
        expected = getattr(getattr(hub_files.get(name), "lfs", None), "sha256", None)
        if expected and sha256 != expected:
            path.unlink()
            raise FetchError(folder / name, f"checksum mismatch: the Hub records sha256 {expected}, the download "
                             f"has {sha256} (the file was removed)", "rerun the fetch job to download it again")
        entries[name] = {"size": path.stat().st_size, "sha256": sha256}
    manifest = {"repo_id": repo_id, "revision": revision, "commit": info.sha, "endpoint": where, "files": entries}
    (part / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(part, folder)
    log.info("%s: %d files of %s at commit %s, %.1f MB", folder, len(entries), repo_id, info.sha,
             sum(e["size"] for e in entries.values()) / 1e6)
    return manifest

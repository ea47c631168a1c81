"""Fetching public collections, the first jobs of the workflow (rules/fetch.smk).

Two sources, both checksummed:

* ``format: ir_datasets`` -- a dataset names an `ir_datasets <https://ir-datasets.com>`_ id per split
  (``beir/scifact/test``, ``msmarco-passage/dev/small``, ...). The library downloads the official files, checks
  their md5 and keeps them in its cache (``IR_DATASETS_HOME``, config ``fetch.cache``);
  :func:`.ir_datasets_export.export_ir_datasets`
  maps its documents, queries and qrels onto the ``parquet`` raw layout in the dataset's ``path``
  (``corpus.parquet``, ``queries_<split>.parquet``, ``qrels_<split>.parquet``), which ingestion then reads and
  checks like any other layout.
* ``downloads`` -- single files ir_datasets does not ship in the form the readers take (MS MARCO's official BM25
  negatives as one file, DPR's NQ test questions), each ``{url, md5 | sha256}``: :func:`.download.download_file` writes
  ``<path>/<name>``, resuming a download a killed job left behind, logging progress, and checking the size the
  server announced and the checksum before the file appears under its name.

This module decides which files a dataset fetches and which fetch jobs exist (a file already in ``path`` is used
as it is: no job). The jobs' code: :mod:`.download` (url + checksum) and :mod:`.ir_datasets_export`.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from dpr_pipeline.data.dev_split import dev_split_of
from dpr_pipeline.data.readers import raw_files
from dpr_pipeline.errors import ConfigError

log = logging.getLogger(__name__)

#: The raw layout an ``ir_datasets`` dataset is exported to (docs/datasets.md, "Dataset layouts").
EXPORT_LAYOUT = "parquet"

# ------------------------------------------------------------------------------------------------- config
def raw_layout(dataset: dict) -> str:
    """The layout ingestion reads in the dataset's ``path``: the exported ``parquet`` one for ``ir_datasets``."""
    return EXPORT_LAYOUT if dataset["format"] == "ir_datasets" else dataset["format"]


def dataset_splits(dataset: dict) -> list[str]:
    """The train split (if any) and the evaluation splits, each once, in that order; a dev split carved from the
    train split is not a split of the collection (its queries are in the train split's files)."""
    train = [dataset["train_split"]] if dataset.get("train_split") else []
    dev = dev_split_of(dataset)
    carved = [dev.name] if dev is not None and dev.carved else []
    return [s for s in dict.fromkeys(train + list(dataset["eval_splits"])) if s not in carved]


def ir_datasets_ids(dataset: dict) -> dict[str, str]:
    """``{split: ir_datasets id}`` of the splits the dataset uses (train first)."""
    return {split: dataset["ir_datasets"][split] for split in dataset_splits(dataset)}


def export_files(dataset: dict) -> dict[str, str]:
    """The files :func:`.ir_datasets_export.export_ir_datasets` writes into ``path``: ``corpus``, ``queries_<split>``, ``qrels_<split>``."""
    root = Path(dataset["path"])
    files = {"corpus": str(root / "corpus.parquet")}
    for split in dataset_splits(dataset):
        files[f"queries_{split}"] = str(root / f"queries_{split}.parquet")
        files[f"qrels_{split}"] = str(root / f"qrels_{split}.parquet")
    return files


def download_targets(dataset: dict) -> dict[str, dict]:
    """``{file in path: {url, md5 | sha256, headers}}`` of the dataset's ``downloads``."""
    root = Path(dataset["path"])
    return {str(root / name): spec for name, spec in (dataset.get("downloads") or {}).items()}


def missing_downloads(dataset: dict) -> dict[str, dict]:
    """The :func:`download_targets` not yet in the dataset's path: the only ones that get a download job. A file
    already there (downloaded before, put there by hand) has no producer, so Snakemake never plans to fetch it
    again and never removes it first, even where it is older than the download script (Snakemake's code trigger:
    a fresh clone of the pipeline next to week-old data; a compute node without internet)."""
    return {file: spec for file, spec in download_targets(dataset).items() if not Path(file).exists()}


def missing_exports(dataset: dict) -> dict[str, str]:
    """The :func:`export_files` of an ``ir_datasets`` dataset when one of them is missing, else ``{}`` (no
    export job: the files there are used as they are, for the reason :func:`missing_downloads` gives)."""
    files = export_files(dataset)
    return files if any(not Path(file).exists() for file in files.values()) else {}


def fetched_files(dataset: dict) -> list[str]:
    """Every file the fetch jobs write for a dataset (what ``snakemake fetch_<dataset>`` builds)."""
    files = list(export_files(dataset).values()) if dataset["format"] == "ir_datasets" else []
    return files + list(download_targets(dataset))


def with_downloads(dataset: dict, paths) -> list[str]:
    """Raw input paths, each missing one replaced by the ``downloads`` entry that provides it (the same name or
    the name with ``.gz``), so a fresh clone plans the download job instead of stopping at a missing file."""
    targets = download_targets(dataset)
    resolved = []
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        path = str(path)
        if not Path(path).exists() and path not in targets and path + ".gz" in targets:
            path += ".gz"
        resolved.append(path)
    return resolved


def raw_inputs(dataset: dict, split: str | None = None, files: dict | None = None) -> list[str]:
    """The raw files ingestion reads for the corpus (``split=None``) or a split, as Snakemake inputs: the exported
    Parquet files of an ``ir_datasets`` dataset, else the layout's files (``readers.raw_files``) with missing ones
    provided by ``downloads`` (:func:`with_downloads`)."""
    if dataset["format"] == "ir_datasets":
        exported = export_files(dataset)
        return [exported["corpus"]] if split is None else [exported[f"queries_{split}"], exported[f"qrels_{split}"]]
    return with_downloads(dataset, raw_files(dataset["format"], dataset["path"], split, files))


def rule_suffix(text: str) -> str:
    """``text`` as a part of a rule name (letters, digits, underscores)."""
    return re.sub(r"\W+", "_", text).strip("_")


def check_fetch_config(config: dict) -> None:
    """Checks the schema cannot express: an ``ir_datasets`` dataset names an id for each split it uses; a
    ``downloads`` name stays inside ``path``; no two datasets fetch into the same file."""
    owner: dict[str, str] = {}
    for name, dataset in config["datasets"].items():
        key = f"config key datasets.{name}"
        if dataset["format"] == "ir_datasets":
            ids = dataset.get("ir_datasets") or {}
            missing = [s for s in dataset_splits(dataset) if s not in ids]
            if missing:
                raise ConfigError(f"{key}.ir_datasets: format ir_datasets needs an ir_datasets id for split(s) "
                                  f"{missing} (has {sorted(ids)}); add e.g. `ir_datasets: {{{missing[0]}: "
                                  f"beir/scifact/{missing[0]}}}` (ids: https://ir-datasets.com)")
        for file in (dataset.get("downloads") or {}):
            parts = Path(file).parts
            if Path(file).is_absolute() or ".." in parts or not parts:
                raise ConfigError(f"{key}.downloads: {file!r} must be a file name inside the dataset's path "
                                  "(relative, without '..')")
        for file in fetched_files(dataset):
            normal = os.path.normpath(file)
            if normal in owner and owner[normal] != name:
                raise ConfigError(f"{key}: fetches {file}, which dataset {owner[normal]!r} fetches too; give the "
                                  "datasets different `path`s")
            owner[normal] = name

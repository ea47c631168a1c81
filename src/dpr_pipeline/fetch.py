"""Fetching public collections, the first jobs of the workflow (rules/fetch.smk).

Two sources, both checksummed:

* ``format: ir_datasets`` -- a dataset names an `ir_datasets <https://ir-datasets.com>`_ id per split
  (``beir/scifact/test``, ``msmarco-passage/dev/small``, ...). The library downloads the official files, checks
  their md5 and keeps them in its cache (``IR_DATASETS_HOME``, config ``fetch.cache``); :func:`export_ir_datasets`
  maps its documents, queries and qrels onto the ``parquet`` raw layout in the dataset's ``path``
  (``corpus.parquet``, ``queries_<split>.parquet``, ``qrels_<split>.parquet``), which ingestion then reads and
  checks like any other layout.
* ``downloads`` -- single files ir_datasets does not ship in the form the readers take (MS MARCO's official BM25
  negatives as one file, DPR's NQ test questions), each ``{url, md5 | sha256}``: :func:`download_file` writes
  ``<path>/<name>``, resuming a download a killed job left behind, logging progress, and checking the size the
  server announced and the checksum before the file appears under its name.

Files already in ``path`` are used as they are: Snakemake runs a fetch job only for a missing file.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import io
import logging
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

from .errors import DataError

log = logging.getLogger(__name__)

#: The raw layout an ``ir_datasets`` dataset is exported to (README, "Dataset layouts").
EXPORT_LAYOUT = "parquet"
_CHUNK = 1 << 20
_LOCAL_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


class FetchError(DataError):
    """A download that failed or does not match its checksum. ``str(error)``: ``<file>: <problem>. Fix: <fix>``."""


# ------------------------------------------------------------------------------------------------- config
def raw_layout(dataset: dict) -> str:
    """The layout ingestion reads in the dataset's ``path``: the exported ``parquet`` one for ``ir_datasets``."""
    return EXPORT_LAYOUT if dataset["format"] == "ir_datasets" else dataset["format"]


def dataset_splits(dataset: dict) -> list[str]:
    """The train split (if any) and the evaluation splits, each once, in that order."""
    train = [dataset["train_split"]] if dataset.get("train_split") else []
    return list(dict.fromkeys(train + list(dataset["eval_splits"])))


def ir_datasets_ids(dataset: dict) -> dict[str, str]:
    """``{split: ir_datasets id}`` of the splits the dataset uses (train first)."""
    return {split: dataset["ir_datasets"][split] for split in dataset_splits(dataset)}


def export_files(dataset: dict) -> dict[str, str]:
    """The files :func:`export_ir_datasets` writes into ``path``: ``corpus``, ``queries_<split>``, ``qrels_<split>``."""
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
    from .data.readers import raw_files

    return with_downloads(dataset, raw_files(dataset["format"], dataset["path"], split, files))


def rule_suffix(text: str) -> str:
    """``text`` as a part of a rule name (letters, digits, underscores)."""
    return re.sub(r"\W+", "_", text).strip("_")


def check_fetch_config(config: dict) -> None:
    """Checks the schema cannot express: an ``ir_datasets`` dataset names an id for each split it uses; a
    ``downloads`` name stays inside ``path``; no two datasets fetch into the same file."""
    from .config import ConfigError

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
            for option in ("split_files",):
                if dataset.get(option):
                    raise ConfigError(f"{key}.{option}: an ir_datasets dataset has no raw files to rename; remove it")
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


# ---------------------------------------------------------------------------------------- url + checksum
def _human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1000
    return f"{size:.1f} TB"


def file_hash(path: str | Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


class _Truncated(Exception):
    def __init__(self, received: int, total: int):
        super().__init__(f"the connection closed after {received} of {total} bytes")
        self.received, self.total = received, total


def _fetch_into(url: str, part: Path, headers: dict, timeout: float, progress_every: float) -> None:
    """Download ``url`` into ``part``, continuing a partial ``part`` where the server accepts a range request."""
    have = part.stat().st_size if part.exists() else 0
    request_headers = {"User-Agent": "dpr_pipeline", **headers}
    if have:
        request_headers["Range"] = f"bytes={have}-"
    with urllib.request.urlopen(urllib.request.Request(url, headers=request_headers), timeout=timeout) as response:
        if have and response.status == 206:
            log.info("%s: resuming after %s already downloaded", part.name, _human(have))
            start, mode = have, "ab"
        else:
            if have:
                log.info("%s: the server does not resume downloads; starting again", part.name)
            start, mode = 0, "wb"
        length = response.headers.get("Content-Length")
        total = start + int(length) if length is not None else None
        received, began, last = start, time.monotonic(), time.monotonic()
        with open(part, mode) as out:
            while True:
                chunk = response.read(_CHUNK)
                if not chunk:
                    break
                out.write(chunk)
                received += len(chunk)
                now = time.monotonic()
                if now - last >= progress_every:
                    share = f" of {_human(total)} ({100 * received / total:.1f} %)" if total else ""
                    log.info("%s: %s%s, %s/s", part.name, _human(received), share,
                             _human((received - start) / max(now - began, 1e-9)))
                    last = now
        if total is not None and received < total:
            raise _Truncated(received, total)
        log.info("%s: %s downloaded in %.1f s", part.name, _human(received), time.monotonic() - began)


def download_file(url: str, dest: str | Path, *, md5: str | None = None, sha256: str | None = None,
                  headers: dict | None = None, tries: int = 3, timeout: float = 60.0, retry_wait: float = 5.0,
                  progress_every: float = 30.0) -> str:
    """Download ``url`` to ``dest`` and check it; return the file's SHA-256.

    The bytes go to ``<dest>.part`` first; only a complete file whose checksum (``sha256`` or ``md5``) matches
    is renamed to ``dest``. A ``.part`` left by a killed job is continued with an HTTP range request (or
    restarted where the server does not support ranges). A connection that drops is retried ``tries`` times,
    continuing where it stopped. A download that stays short of the announced size, fails, or does not match
    its checksum raises one :class:`FetchError` naming the file (expected and found sum or size) and removes
    ``.part``: nothing is left behind.
    """
    dest = Path(dest)
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    algorithm, expected = ("sha256", sha256) if sha256 else ("md5", md5) if md5 else (None, None)
    log.info("downloading %s -> %s (%s)", url, dest, f"{algorithm} {expected}" if expected else "no checksum")
    for attempt in range(1, tries + 1):
        truncated = None
        try:
            _fetch_into(url, part, dict(headers or {}), timeout, progress_every)
            break
        except urllib.error.HTTPError as err:
            if err.code == 416:                       # a .part at least as long as the file: start afresh
                part.unlink(missing_ok=True)
            elif 400 <= err.code < 500 and err.code not in (408, 429):
                part.unlink(missing_ok=True)
                raise FetchError(dest, f"the server answered {err.code} {err.reason} for {url}",
                                 "check the `url` of this file under the dataset's `downloads` in config.yaml") from None
            problem = f"HTTP {err.code} {err.reason}"
        except _Truncated as err:
            problem, truncated = str(err), err
        except (OSError, http.client.HTTPException) as err:
            problem = f"{type(err).__name__}: {err}"
        if attempt == tries:
            part.unlink(missing_ok=True)
            if truncated is not None:
                raise FetchError(dest, f"the download from {url} is truncated: expected {truncated.total} bytes, "
                                 f"found {truncated.received} (after {tries} attempts)",
                                 "rerun the fetch job; if it stays short, the server or the network cuts the "
                                 "transfer: download the file by hand into the dataset's path") from None
            raise FetchError(dest, f"the download from {url} failed after {tries} attempts ({problem})",
                             "check that this node reaches the server (compute nodes without internet: run the "
                             "fetch on the login node, docs/cluster.md), then rerun") from None
        log.warning("%s: attempt %d of %d failed (%s); trying again, continuing the partial file",
                    dest.name, attempt, tries, problem)
        time.sleep(retry_wait * attempt)
    found_sha256 = file_hash(part, "sha256")
    if expected:
        found = found_sha256 if algorithm == "sha256" else file_hash(part, algorithm)
        if found != expected.lower():
            part.unlink(missing_ok=True)
            raise FetchError(dest, f"checksum mismatch: expected {algorithm} {expected.lower()}, found {found} "
                             f"(downloaded from {url}; the partial file was removed)",
                             "rerun the fetch job to download it again; if the same sum comes back, the file "
                             "changed at its source: check `url` and the checksum in config.yaml")
    else:
        log.warning("%s has no checksum in config.yaml; its sha256 is %s: add `sha256: %s` to pin it",
                    dest, found_sha256, found_sha256)
    os.replace(part, dest)
    log.info("%s: %s OK", dest, f"{algorithm} {expected.lower()}" if expected else f"sha256 {found_sha256}")
    return found_sha256


# ---------------------------------------------------------------------------------------------- ir_datasets
class ProgressToLog(io.TextIOBase):
    """A stand-in for ``sys.stderr`` that writes what the library prints into the job's log: every completed line,
    and of the progress bars (tqdm redraws a line ending in a carriage return) one every ``every`` seconds."""

    def __init__(self, logger: logging.Logger, every: float = 30.0):
        self._logger, self._every, self._buffer, self._last = logger, every, "", float("-inf")

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._buffer += text
        while True:
            found = re.search(r"[\r\n]", self._buffer)
            if not found:
                return len(text)
            segment, end = self._buffer[:found.start()].strip(), found[0]
            self._buffer = self._buffer[found.end():]
            if not segment:
                continue
            if end == "\n":
                self._logger.info("%s", segment)
            elif time.monotonic() - self._last >= self._every:
                self._logger.info("%s", segment)
                self._last = time.monotonic()


def _load_ir_datasets(cache: str | Path):
    """The ir_datasets module with its cache in ``cache`` (IR_DATASETS_HOME, read when the library is imported)."""
    cache = str(Path(cache).expanduser().resolve())
    if "ir_datasets" in sys.modules and os.environ.get("IR_DATASETS_HOME") != cache:
        raise RuntimeError(f"ir_datasets was imported with another cache ({os.environ.get('IR_DATASETS_HOME')}) "
                           f"than {cache}; export in a fresh process")
    os.environ["IR_DATASETS_HOME"] = cache
    Path(cache).mkdir(parents=True, exist_ok=True)
    try:
        import ir_datasets
    except ImportError:
        raise RuntimeError("format ir_datasets needs the ir_datasets package: pip install -c constraints.txt -e . "
                           "(or pip install ir_datasets)") from None
    return ir_datasets


def _text_fields(record) -> tuple[str, str]:
    """(title, text) of an ir_datasets document or query: its ``title`` and ``text`` fields where it has them
    (BEIR, MS MARCO, DPR's passages), else the library's ``default_text()``."""
    fields = getattr(record, "_fields", ())
    title = getattr(record, "title", "") if "title" in fields else ""
    text = getattr(record, "text") if "text" in fields else record.default_text()
    return ("" if title is None else str(title)), ("" if text is None else str(text))


@contextlib.contextmanager
def _library_errors(name: str, dataset_id: str, cache: Path) -> Iterator[None]:
    """The library's download failures as one FetchError naming the id, the cache and the fix."""
    try:
        yield
    except FetchError:
        raise
    except OSError as err:
        if err.errno in _LOCAL_WRITE_ERRORS:   # our disk, not the download: atomic_outputs names the output
            raise
        _raise_library_error(name, dataset_id, cache, err)
    except Exception as err:
        _raise_library_error(name, dataset_id, cache, err)


def _raise_library_error(name: str, dataset_id: str, cache: Path, err: Exception) -> None:
    """requests' errors, HashVerificationError (an IOError), "All download sources failed" -> FetchError."""
    text = str(err)
    found = re.search(r"Expected (\w+) hash to be (\w+) but got (\w+)", text)
    if found:
        problem = (f"checksum mismatch in a file of {dataset_id}: expected {found[1]} {found[2]}, found "
                   f"{found[3]} (ir_datasets removed the partial file)")
        fix = "rerun the fetch job to download it again"
    else:
        problem = f"ir_datasets could not provide {dataset_id} ({type(err).__name__}: {text[:500]})"
        fix = (f"check that this node reaches the download servers (compute nodes without internet: run "
               f"`snakemake --cores 1 fetch_{name}` on the login node, docs/cluster.md), then rerun")
    raise FetchError(cache, problem, fix) from err


def export_ir_datasets(name: str, ids: dict[str, str], outputs: dict[str, str | Path], cache: str | Path,
                       batch_rows: int = 100_000) -> dict[str, int]:
    """Fetch ``ids`` (``{split: ir_datasets id}``) through ir_datasets into ``cache`` and write the ``parquet`` raw
    layout: ``outputs["corpus"]`` (doc_id, title, text) from the documents the ids share, and per split
    ``outputs["queries_<split>"]`` (query_id, text: every query of the id) and ``outputs["qrels_<split>"]``
    (query_id, doc_id, relevance). All files appear together or not at all. Returns the row counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .data.schemas import SCHEMAS
    from .io import atomic_outputs

    cache = Path(cache).expanduser().resolve()
    ir_datasets = _load_ir_datasets(cache)
    loaded, parents = {}, {}
    for split, dataset_id in ids.items():
        try:
            loaded[split] = ir_datasets.load(dataset_id)
        except KeyError:
            raise FetchError(f"config.yaml datasets.{name}.ir_datasets.{split}", f"unknown ir_datasets id "
                             f"{dataset_id!r}", "use an id listed on https://ir-datasets.com (e.g. beir/scifact/test, "
                             "msmarco-passage/dev/small)") from None
        if not (loaded[split].has_queries() and loaded[split].has_qrels() and loaded[split].has_docs()):
            raise FetchError(f"config.yaml datasets.{name}.ir_datasets.{split}", f"{dataset_id!r} lacks documents, "
                             "queries or qrels", "use an id with all three (e.g. msmarco-passage/dev/small, not "
                             "msmarco-passage/dev)")
        parents[split] = ir_datasets.docs_parent_id(dataset_id)
    if len(set(parents.values())) > 1:
        raise FetchError(f"config.yaml datasets.{name}.ir_datasets", f"the splits' ids use different corpora "
                         f"({parents})", "give every split an id of the same collection")
    counts: dict[str, int] = {}
    names = list(outputs)
    with atomic_outputs(*(outputs[n] for n in names)) as temporaries:
        tmp = dict(zip(names, temporaries))
        first_split, first = next(iter(loaded.items()))
        with _library_errors(name, ids[first_split], cache):
            schema = SCHEMAS["corpus"]
            with pq.ParquetWriter(tmp["corpus"], schema) as writer:
                batch: list[tuple[str, str, str]] = []
                count = 0
                for doc in first.docs_iter():
                    title, text = _text_fields(doc)
                    batch.append((str(doc.doc_id), title, text))
                    count += 1
                    if len(batch) >= batch_rows:
                        writer.write_table(_corpus_table(batch, schema, pa))
                        batch.clear()
                        log.info("%s: %d documents exported", name, count)
                writer.write_table(_corpus_table(batch, schema, pa))
            counts["corpus"] = count
        for split, dataset in loaded.items():
            with _library_errors(name, ids[split], cache):
                queries = [(str(q.query_id), _text_fields(q)[1]) for q in dataset.queries_iter()]
                qrels = [(str(j.query_id), str(j.doc_id), int(j.relevance)) for j in dataset.qrels_iter()]
            pq.write_table(pa.table({"query_id": [q for q, _ in queries], "text": [t for _, t in queries]},
                                    schema=SCHEMAS["queries"]), tmp[f"queries_{split}"])
            pq.write_table(pa.table({"query_id": [q for q, _, _ in qrels], "doc_id": [d for _, d, _ in qrels],
                                     "relevance": [r for _, _, r in qrels]}, schema=SCHEMAS["qrels"]),
                           tmp[f"qrels_{split}"])
            counts[f"queries_{split}"], counts[f"qrels_{split}"] = len(queries), len(qrels)
            log.info("%s: split %s (%s): %d queries, %d judgements", name, split, ids[split], len(queries), len(qrels))
    log.info("%s: %d documents of %s exported", name, counts["corpus"], parents[first_split])
    return counts


def _corpus_table(batch, schema, pa):
    return pa.table({"doc_id": [d for d, _, _ in batch], "title": [t for _, t, _ in batch],
                     "text": [x for _, _, x in batch]}, schema=schema)

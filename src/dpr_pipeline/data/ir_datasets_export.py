"""Exporting an ``ir_datasets`` collection (the library downloads and md5-checks the official files into its
cache) onto the ``parquet`` raw layout in the dataset's ``path``: ``corpus.parquet``, ``queries_<split>.parquet``,
``qrels_<split>.parquet`` (rules/fetch.smk's ``ir_datasets_<dataset>`` job; which files: :mod:`.fetch`)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from dpr_pipeline.atomic_writes import atomic_outputs
from dpr_pipeline.data.download import LOCAL_WRITE_ERRORS
from dpr_pipeline.data.schemas import SCHEMAS
from dpr_pipeline.errors import FetchError

log = logging.getLogger(__name__)

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
        if err.errno in LOCAL_WRITE_ERRORS:   # our disk, not the download: atomic_outputs names the output
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
    cache = Path(cache).expanduser().resolve()
    loaded, parents = _load_splits(name, ids, _load_ir_datasets(cache))
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


def _load_splits(name: str, ids: dict[str, str], ir_datasets) -> tuple[dict, dict[str, str]]:
    """``({split: ir_datasets dataset}, {split: its documents' parent id})``; an unknown id, one without
    documents, queries or qrels, or splits of different collections is a FetchError naming the config key."""
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
    return loaded, parents


def _corpus_table(batch, schema, pa):
    return pa.table({"doc_id": [d for d, _, _ in batch], "title": [t for _, t, _ in batch],
                     "text": [x for _, _, x in batch]}, schema=schema)

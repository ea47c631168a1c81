"""Where the workflow's files live: every path under ``results/{dataset}/`` is built here, so a rule, an input
function, the report's job list and a test name a file the same way (docs/artifacts.md lists what each holds).

Each function returns a path string; its ``dataset`` (and any other part) defaults to a Snakemake wildcard
(``{dataset}``), so the same call gives a rule's pattern (``log_file("bm25_index")`` =
``results/{dataset}/logs/bm25_index.log``) or, given values, a concrete file.
"""

from __future__ import annotations

RESULTS = "results"
WILDCARD = "{dataset}"
#: The folder of the start pre-training draws from its plm (``pretrain.reinitialize_layers``), read by every method
#: and by the ablation's ``none`` row: ``results/<dataset>/pretrain_start/model``.
PRETRAINING_START = "pretrain_start"
#: The teacher scores a student learns (``distill.teacher``), in the teacher's stage folder: the re-ranker's θ, or θ
#: fused with Retriever2's scores (:func:`dpr_pipeline.reranking.score_fusion.fused_teacher_scores`).
TEACHER_SCORES = {"reranker": "teacher_scores.parquet", "fused": "fused_teacher_scores.parquet"}


def dataset_dir(dataset: str = WILDCARD) -> str:
    """``results/<dataset>``: everything the workflow writes for one dataset."""
    return f"{RESULTS}/{dataset}"


def dataset_file(name: str, dataset: str = WILDCARD) -> str:
    """``results/<dataset>/<name>``: a dataset-level output (the summaries, the transfer leakage counts)."""
    return f"{dataset_dir(dataset)}/{name}"


def stage_file(stage: str, name: str, dataset: str = WILDCARD) -> str:
    """``results/<dataset>/<stage>/<name>``: a stage's output (``stage`` may be a wildcard, ``{stage}``)."""
    return f"{dataset_dir(dataset)}/{stage}/{name}"


def negatives_filter_files(stage: str, dataset: str = WILDCARD) -> dict[str, str]:
    """Beside a mined stage's ``negatives.parquet`` (``mining.<stage>``'s filters, docs/artifacts.md): the counts
    of what its filters dropped, ``filter_report`` (``negatives_filter.json``), and a sample of the dropped pairs
    with their texts, ``dropped_sample`` (``dropped_negatives_sample.jsonl``)."""
    return {"filter_report": stage_file(stage, "negatives_filter.json", dataset),
            "dropped_sample": stage_file(stage, "dropped_negatives_sample.jsonl", dataset)}


def denoise_scores_file(stage: str, dataset: str = WILDCARD) -> str:
    """A mined stage's pool scored by its denoising cross-encoder (``mining.<stage>.denoise``; rule
    ``denoise_scores``): ``results/<dataset>/<stage>/denoise_scores.parquet``, read by the stage's mining job."""
    return stage_file(stage, "denoise_scores.parquet", dataset)


def denoise_pool_file(stage: str, dataset: str = WILDCARD) -> str:
    """A mined stage's candidate pool, written once for its denoising scores' jobs (rule ``denoise_pool``):
    ``results/<dataset>/<stage>/denoise/pool.parquet``."""
    return stage_file(stage, "denoise/pool.parquet", dataset)


def denoise_shard_file(stage: str, shard: str | int, dataset: str = WILDCARD) -> str:
    """One scoring job's part of :func:`denoise_scores_file` (``mining.<stage>.denoise.shards``):
    ``results/<dataset>/<stage>/denoise/shard_<shard>.parquet``."""
    return stage_file(stage, f"denoise/shard_{shard}.parquet", dataset)


def data_file(name: str, dataset: str = WILDCARD) -> str:
    """An ingestion artifact: ``results/<dataset>/data/<name>`` (corpus, queries, qrels, answers, manifests)."""
    return stage_file("data", name, dataset)


def log_file(job: str, dataset: str = WILDCARD) -> str:
    """The log of a job: ``results/<dataset>/logs/<job>.log`` (``job``: the rule's name and its wildcards)."""
    return stage_file("logs", f"{job}.log", dataset)


def error_file(log: str) -> str:
    """The message of a job that failed, beside its log ``log`` (``….log`` -> ``….error``): written by
    ``orchestration.job_log.logged``, read by the Snakefile's ``onerror`` (``run_errors``)."""
    return log[:-len(".log")] + ".error" if log.endswith(".log") else log + ".error"


def benchmark_file(job: str, dataset: str = WILDCARD) -> str:
    """Snakemake's benchmark of a job: ``results/<dataset>/benchmarks/<job>.tsv`` (read by the throughput report)."""
    return stage_file("benchmarks", f"{job}.tsv", dataset)


def checkpoint_dir(stage: str, dataset: str = WILDCARD) -> str:
    """``results/<dataset>/checkpoints/<stage>``: a training job's checkpoints, undeclared on purpose (Snakemake
    keeps the folder when a job fails, so a rerun resumes from it)."""
    return stage_file("checkpoints", stage, dataset)


def model_dir(stage: str, dataset: str = WILDCARD) -> str:
    """``results/<dataset>/<stage>/model``: a stage's model folder (its training rule's output, with its card)."""
    return stage_file(stage, "model", dataset)


def model_stage(path: str, dataset: str) -> str | None:
    """The stage whose model folder ``path`` names (``results/<dataset>/<stage>/model`` -> ``<stage>``), else None:
    :func:`model_dir` read back."""
    prefix, suffix = dataset_dir(dataset) + "/", "/model"
    return path[len(prefix):-len(suffix)] if path.startswith(prefix) and path.endswith(suffix) else None


def release_dir(stage: str, dataset: str = WILDCARD) -> str:
    """``results/<dataset>/<stage>/release``: a stage's model folder ready to publish (its files hard-linked and a
    card with the stage's metrics; rule ``release_model``, not part of the default target)."""
    return stage_file(stage, "release", dataset)


def fetched_model_dir(root: str, repo_id: str, revision: str | None = None) -> str:
    """``<root>/<org>--<name>``: a Hugging Face Hub model fetched for the jobs (rule ``fetch_model_<name>``;
    ``root``: config ``fetch.models``), shared by every dataset that names it; a pinned ``revision`` (config
    ``fetch.revisions``) gets a folder of its own, ``<org>--<name>@<revision>``."""
    name = repo_id.replace("/", "--")
    return f"{root}/{name}" + (f"@{revision.replace('/', '--')}" if revision else "")


def fetched_model_log(folder: str, suffix: str = ".log") -> str:
    """The fetch job's log of a fetched model folder: ``<root>/logs/<folder name>.log`` (its benchmark: the same
    with ``suffix`` ``.benchmark.tsv``)."""
    root, _, name = folder.rpartition("/")
    return f"{root}/logs/{name}{suffix}"

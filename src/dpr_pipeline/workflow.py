"""Helpers for the thin ``workflow_scripts/``: send logging and tracebacks to the rule's log file."""

from __future__ import annotations

import contextlib
import logging
import sys
import traceback
from pathlib import Path
from typing import Iterator

from .errors import PipelineError
from .layout import error_file
from .run_errors import job_error_line, write_job_error


@contextlib.contextmanager
def logged(log_file: str | Path, threads: int | None = None) -> Iterator[logging.Logger]:
    """Log INFO and above to ``log_file`` and stderr; an exception's traceback goes to ``log_file``, and its
    message to the job's error file (:func:`~dpr_pipeline.layout.error_file`), which the Snakefile's ``onerror``
    shows as the run's last lines (:mod:`dpr_pipeline.run_errors`).

    A :class:`~dpr_pipeline.errors.PipelineError` (bad data or config, an unusable checkpoint, an output that
    cannot be written) is the user's to fix: stderr gets its message alone, without the traceback, and the job
    exits with status 1. Any other exception is a bug: re-raised, so Python prints its traceback on stderr
    (once: the log file's copy is not echoed there).

    ``threads``: the job's CPU threads (Snakemake's ``threads``), given to PyTorch's intra-op pool.
    """
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    error_path = Path(error_file(str(log_file)))
    error_path.unlink(missing_ok=True)      # a message of an earlier run of this job is not this run's
    console = logging.StreamHandler(sys.stderr)
    handlers = [logging.FileHandler(log_file, mode="w", encoding="utf-8"), console]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        handlers=handlers, force=True)
    logging.getLogger("faiss").setLevel(logging.WARNING)
    logger = logging.getLogger("dpr_pipeline")
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        yield logger
    except BaseException as error:
        logging.getLogger().removeHandler(console)
        logger.error("failed:\n%s", traceback.format_exc())
        if not isinstance(error, Exception):      # Ctrl-C, sys.exit: nothing to report
            raise
        write_job_error(error_path, error)
        if not isinstance(error, PipelineError):
            raise
        print(job_error_line(error), file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _files_by_name(files) -> dict:
    """A Snakemake input/output list as ``{name: path or [paths]}``; unnamed files under ``files``."""
    named = {name: value if isinstance(value, str) else list(value) for name, value in files.items()
             if isinstance(value, str) or len(value)}
    covered = {p for value in named.values() for p in ([value] if isinstance(value, str) else value)}
    rest = [str(f) for f in files if f not in covered]
    return {**named, "files": rest} if rest else named


def negative_counts(negatives_path) -> list[int]:
    """Per query of a negatives (or teacher scores) artifact, the negatives it offers."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    column = pq.read_table(negatives_path, columns=["negative_ids"]).column("negative_ids")
    return pc.list_value_length(column).to_pylist()


def group_negatives(snakemake, params: dict, *, in_batch: bool) -> dict:
    """The negatives a training query of a fine-tuning job sees (:func:`dpr_pipeline.manifest.negatives_per_query`)."""
    from .manifest import negatives_per_query

    return negatives_per_query(negative_counts(snakemake.input.negatives), params["negatives_per_query"],
                               batch_size=params["batch_size"], in_batch=in_batch)


def write_job_manifest(snakemake, stage: str, *, seed: int | None, world_size: int = 1,
                       negatives: dict | None = None, report: dict | None = None, model_card: bool = False) -> None:
    """Write the job's ``manifest`` output (:mod:`dpr_pipeline.manifest`): its inputs and outputs with their
    hashes, its resolved parameters and the whole resolved config, seed, world size, negatives and software.

    ``model_card``: first write the card (:mod:`dpr_pipeline.model_card`, from the same facts) into the job's
    ``model`` output, so that the manifest's hash of the folder includes it."""
    from .manifest import build_manifest, write_manifest

    from .models import resolve_model_path

    inputs = _files_by_name(snakemake.input)
    outputs = {k: v for k, v in _files_by_name(snakemake.output).items() if k != "manifest"}
    parameters = {k: v for k, v in snakemake.params.items()}
    read = {p for value in inputs.values() for p in ([value] if isinstance(value, str) else value)}
    for values in parameters.values():  # the model training starts from, unless already an input
        if isinstance(values, dict) and isinstance(values.get("plm"), str) and values["plm"] not in read:
            inputs["plm"] = resolve_model_path(values["plm"])
    if model_card:
        from .model_card import write_model_card

        write_model_card(snakemake.output.model, {"stage": stage, "dataset": snakemake.wildcards.dataset,
                                                  "parameters": parameters, "config": snakemake.config,
                                                  "seed": seed, "negatives": negatives, "inputs": inputs,
                                                  "report": report})
    manifest = build_manifest(stage=stage, dataset=snakemake.wildcards.dataset, rule=snakemake.rule,
                              inputs=inputs, outputs=outputs, parameters=parameters,
                              config=snakemake.config, seed=seed, world_size=world_size, negatives=negatives,
                              report=report)
    write_manifest(snakemake.output.manifest, manifest)


#: A bi-encoder training job's inputs for its dev selection (rules/inputs.smk, selection_inputs), by the names
#: :func:`dpr_pipeline.dev_selection.select` reads them.
SELECTION_INPUTS = {"dev_queries": "queries", "dev_qrels": "qrels", "dev_pool_run": "pool_run",
                    "dev_start_run": "start_run"}


def selection_options(snakemake) -> dict:
    """A bi-encoder training job's ``selection`` argument (:func:`dpr_pipeline.training.biencoder.train_biencoder`):
    its settings, its dev files and its ``output``, the job's dev_selection.json."""
    files = {name: getattr(snakemake.input, key) for key, name in SELECTION_INPUTS.items()
             if key in snakemake.input.keys()}
    return {**snakemake.params.selection, "files": files, "output": snakemake.output.selection}


def run_training_job(snakemake, train, stage: str, params: dict, *, in_batch: bool, **options) -> None:
    """A training rule's job: ``train`` (``train_biencoder``, ``train_reranker``) on the rule's negatives, corpus
    and queries, in one process per GPU the job holds (torchrun when several), then the model folder's card and
    the stage's manifest (a bi-encoder's dev choice, ``options["selection"]``, under its ``report``).
    ``in_batch``: the loss also contrasts every query with the batch's other passages (the bi-encoders)."""
    from .cluster import processes_for
    from .dev_selection import read_selection
    from .training.launch import run_training

    processes = processes_for(snakemake.resources.gpu)
    run_training(train, processes, stage=stage, negatives_path=snakemake.input.negatives,
                 passages_path=snakemake.input.passages,
                 queries_path=snakemake.input.queries, output_dir=snakemake.output.model,
                 checkpoint_dir=snakemake.params.checkpoints, loss_log=snakemake.output.loss_log, params=params,
                 **options)
    selection = options.get("selection")
    write_job_manifest(snakemake, stage, seed=params["seed"], world_size=processes,
                       negatives=group_negatives(snakemake, params, in_batch=in_batch), model_card=True,
                       report={"dev_selection": read_selection(selection["output"])} if selection else None)

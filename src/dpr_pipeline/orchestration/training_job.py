"""A training rule's job: its model trained in one process per GPU it holds, then the model's card and the
stage's manifest; the negatives a query sees and the dev files of its selection, from the job's inputs."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.orchestration.card import write_job_card
from dpr_pipeline.training.launch import run_training
from dpr_pipeline.training.selection_record import (START, describe, read_selection, selection_record,
                                                    teacher_below_start, write_selection)
from dpr_pipeline.stages import settings_class
from dpr_pipeline.training.settings import (BiEncoderSettings, DevFiles, DevSelection, DevSelectionSettings,
                                            RerankerSettings, StageSettings)
from dpr_pipeline.training.tracking import dev_scores, log_once
from dpr_pipeline.orchestration.manifests import negatives_per_query, write_job_manifest
from dpr_pipeline.orchestration.resources import nodes_of, processes_for

log = logging.getLogger(__name__)


def negative_counts(negatives_path) -> list[int]:
    """Per query of a negatives (or teacher scores) artifact, the negatives it offers."""
    column = pq.read_table(negatives_path, columns=["negative_ids"]).column("negative_ids")
    return pc.list_value_length(column).to_pylist()


def job_settings(stage: str, params: dict) -> StageSettings:
    """The settings of a training job of ``stage`` from its params, strictly (:meth:`StageSettings.from_params`),
    as the class of its declared trainer (:func:`dpr_pipeline.stages.settings_class`)."""
    return settings_class(stage).from_params(params, stage)


def group_negatives(snakemake, settings: BiEncoderSettings | RerankerSettings, *, in_batch: bool) -> dict:
    """The negatives a training query of a fine-tuning job sees
    (:func:`dpr_pipeline.orchestration.manifests.negatives_per_query`)."""
    return negatives_per_query(negative_counts(snakemake.input.negatives), settings.negatives_per_query,
                               batch_size=settings.training.batch_size, in_batch=in_batch)


#: A bi-encoder training job's inputs for its dev selection (rules/inputs.smk, selection_inputs), by the
#: :class:`~dpr_pipeline.training.settings.DevFiles` field each one is.
SELECTION_INPUTS = {"dev_queries": "queries", "dev_qrels": "qrels", "dev_start_run": "start_run",
                    "teacher_metrics": "teacher_metrics", "start_metrics": "start_metrics"}


def dev_selection(snakemake) -> DevSelection:
    """A bi-encoder training job's ``selection`` argument (:func:`dpr_pipeline.training.biencoder.train_biencoder`):
    its settings, built once from its params, its dev files and its ``output``, the job's dev_selection.json."""
    files = DevFiles(**{field: getattr(snakemake.input, key) for key, field in SELECTION_INPUTS.items()
                        if key in snakemake.input.keys()})
    return DevSelection(DevSelectionSettings.from_params(snakemake.params.selection), files,
                        snakemake.output.selection)


def run_training_job(snakemake, stage: str, settings: BiEncoderSettings | RerankerSettings, *, in_batch: bool,
                     selection: DevSelection | None = None) -> None:
    """A training rule's job: ``stage``'s trainer (:data:`dpr_pipeline.stages.TRAINERS`: ``train_biencoder``,
    ``train_reranker``) with the job's ``settings`` on the rule's negatives, corpus and queries, in one process per
    GPU the job holds (torchrun when several, one per node of the job), then the model folder's card and the stage's
    manifest (a bi-encoder's dev choice, ``selection``, under its ``report``); with `tracking` on, the training's
    curves and the dev choice's scores go to the stage's tracked run. ``in_batch``: the loss also contrasts every
    query with the batch's other passages (the bi-encoders)."""
    seed = settings.training.seed
    resources = dict(snakemake.resources.items())
    processes = processes_for(resources)
    tracking = snakemake.params.tracking        # the stage's tracked run (training/tracking.py); off by default
    untrained = teacher_verdict(selection, settings.plm) if selection else None
    if untrained is not None:
        hand_on_start(settings.plm, snakemake.output.model, snakemake.output.loss_log, selection.output, untrained)
        report = {"dev_selection": untrained}
        write_job_card(snakemake, stage, seed=seed, report=report)
        write_job_manifest(snakemake, stage, seed=seed, world_size=processes, report=report)
        return
    run_training(stage, processes, nodes=nodes_of(resources), cpus_per_node=snakemake.threads,
                 negatives_path=snakemake.input.negatives, passages_path=snakemake.input.passages,
                 queries_path=snakemake.input.queries, output_dir=snakemake.output.model,
                 checkpoint_dir=snakemake.params.checkpoints, loss_log=snakemake.output.loss_log, settings=settings,
                 tracking=tracking.as_dict(), **({"selection": selection} if selection else {}))
    if selection:
        log_once(tracking, dev_scores(read_selection(selection.output)))
    negatives = group_negatives(snakemake, settings, in_batch=in_batch)
    report = {"dev_selection": read_selection(selection.output)} if selection else None
    write_job_card(snakemake, stage, seed=seed, negatives=negatives, report=report)
    write_job_manifest(snakemake, stage, seed=seed, world_size=processes, negatives=negatives, report=report)


def teacher_verdict(selection: DevSelection, start_model: str) -> dict | None:
    """A student's dev_selection.json record when its teacher is not above its start on dev (the student is then
    not trained and its start goes on), else None (:func:`~dpr_pipeline.training.selection_record.teacher_below_start`)."""
    files, chosen = selection.files, selection.settings
    if files.teacher_metrics is None:
        return None
    below = teacher_below_start(files.teacher_metrics, files.start_metrics, chosen.split, chosen.metric)
    if below is None:
        return None
    teacher, start = below
    reason = (f"its teacher ({chosen.teacher_label}) is not above its start on {chosen.split} "
              f"({teacher:.4f} against {start:.4f} {chosen.metric}), so distilling it would teach nothing "
              "better than the start already does")
    return selection_record(label=chosen.label, start_label=chosen.start_label, start_model=start_model,
                            handed_on=START, reason=reason)


def hand_on_start(start_model: str, output_model: str, loss_log: str, record_path: str, record: dict) -> None:
    """The stage's outputs without training: its start's folder as its model, an empty loss log, the record."""
    log.warning("%s", describe(record))
    with atomic_output(output_model) as tmp:
        shutil.copytree(start_model, tmp)
    with atomic_output(loss_log) as tmp:
        Path(tmp).write_text("", encoding="utf-8")
    write_selection(record_path, record)

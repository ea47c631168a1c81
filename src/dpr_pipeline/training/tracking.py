"""Experiment tracking (setting `tracking`): a stage's training curves and its metrics sent to TensorBoard, MLflow
or Weights & Biases through their own APIs, one run per stage named ``<dataset>/<stage>`` and grouped per dataset
(TensorBoard: the dataset's folder; MLflow: an experiment named by the dataset; W&B: the run's group).

What a run holds: the trainer's ``train/loss``, ``train/learning_rate`` and ``train/examples_per_second`` per step
(rank 0 of a multi-process training only), the dev selection's scores (``dev/<metric>/trained``,
``…/start``, ``…/handed_on``) after training, and each evaluated split's metrics (``eval/<split>/<metric>``;
``transfer/<target>/<split>/<metric>`` for a transfer evaluation). Off (``backends: []``, the default) a job's
tracker is :class:`NullTracker`: nothing is imported and nothing is written.

A job gets its stage's :class:`TrackingRun` as its ``tracking`` param (:func:`tracking_run`). It is not a plain
value, so Snakemake's params trigger leaves it out: turning tracking on or off reruns no job.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
import time
from pathlib import Path
from typing import Mapping, Protocol

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.layout import RESULTS, stage_file

#: The extra that installs every tracker's package.
EXTRA = "pip install -e '.[tracking]'"
#: Each backend's module and the distribution that installs it.
PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow-skinny"),
            "wandb": ("wandb", "wandb")}
#: The MLflow store a run goes to when `tracking.mlflow_uri` is null: a file store beside the datasets' results.
MLFLOW_FILE_STORE = f"{RESULTS}/mlruns"
TENSORBOARD_FOLDER = "tensorboard"


@dataclasses.dataclass(frozen=True)
class TrackingRun:
    """One stage's run: where and to which backends it is tracked. JSON-able (:meth:`as_dict`) for the torchrun
    workers of a multi-process training."""

    backends: tuple[str, ...]
    dataset: str
    stage: str
    mlflow_uri: str | None = None
    wandb_project: str = "dpr_pipeline"
    wandb_mode: str = "offline"

    @property
    def name(self) -> str:
        return f"{self.dataset}/{self.stage}"

    @property
    def folder(self) -> Path:
        """The stage's results folder (TensorBoard's event files go to its ``tensorboard/``, W&B's to ``wandb/``)."""
        return Path(stage_file(self.stage, "", self.dataset))

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "backends": list(self.backends)}

    @classmethod
    def from_value(cls, value: TrackingRun | Mapping | None) -> TrackingRun | None:
        if value is None or isinstance(value, TrackingRun):
            return value
        return cls(**{**value, "backends": tuple(value["backends"])})


def tracking_run(config: dict, dataset: str, stage: str) -> TrackingRun:
    """A job's ``tracking`` param: the validated config's `tracking` block for ``stage`` of ``dataset``."""
    block = config["tracking"]
    return TrackingRun(tuple(block["backends"]), dataset, stage, block["mlflow_uri"], block["wandb_project"],
                       block["wandb_mode"])


def check_installed(config: dict) -> None:
    """Stop with the extra to install when `tracking.backends` names a tracker whose package is missing (at start-up,
    ``snakemake -n`` included, and again where a job opens its run)."""
    for backend in config["tracking"]["backends"]:
        module, package = PACKAGES[backend]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"config key tracking.backends: {backend!r} needs the package {package}, which is not "
                              f"installed in {sys.prefix}. Fix: {EXTRA} (or `pip install {package}`), or take "
                              f"{backend!r} out of tracking.backends")


class Tracker(Protocol):
    """Where a run's scalars go."""

    def log(self, values: Mapping[str, float], step: int) -> None:
        """Scalars at a training step (0 for the metrics of a finished stage)."""

    def close(self) -> None: ...


class NullTracker:
    """Tracking off (the default, and every process but rank 0 of a multi-process training): nothing written."""

    def log(self, values: Mapping[str, float], step: int) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardTracker:
    """Event files in the stage's ``tensorboard/`` folder (``tensorboard --logdir results/<dataset>`` shows one run
    per stage), written by PyTorch's ``SummaryWriter``. A fresh training starts the folder anew."""

    def __init__(self, run: TrackingRun, fresh: bool):
        from torch.utils.tensorboard import SummaryWriter

        folder = run.folder / TENSORBOARD_FOLDER
        if fresh and folder.is_dir():
            for old in folder.glob("events.out.tfevents.*"):
                old.unlink()
        self.writer = SummaryWriter(log_dir=str(folder))

    def log(self, values: Mapping[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class MlflowTracker:
    """A run named ``<dataset>/<stage>`` in the experiment named by the dataset, in `tracking.mlflow_uri` or the
    file store ``results/mlruns``. A fresh training starts a new run; the dev scores and the evaluation join the
    newest run of the stage (a new one if the stage has none: BM25, the starting model)."""

    STAGE_TAG = "dpr_pipeline.stage"

    def __init__(self, run: TrackingRun, fresh: bool):
        if run.mlflow_uri is None:
            # the file store is in maintenance mode in MLflow 3 and refused unless allowed: this is the setting's
            # documented default, a local store that needs no server
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        import mlflow
        from mlflow.tracking import MlflowClient

        uri = run.mlflow_uri or Path(MLFLOW_FILE_STORE).resolve().as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(run.dataset)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(run.dataset)
        found = [] if fresh else self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{self.STAGE_TAG}` = '{run.stage}'",
            order_by=["attributes.start_time DESC"], max_results=1)
        self.run_id = found[0].info.run_id if found else self.client.create_run(
            experiment_id, run_name=run.name, tags={self.STAGE_TAG: run.stage, "dpr_pipeline.dataset": run.dataset}
        ).info.run_id
        self.metric = mlflow.entities.Metric

    def log(self, values: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self.metric(mlflow_key(key), float(value), now, step)
                                                    for key, value in values.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def mlflow_key(key: str) -> str:
    """A metric name MLflow accepts (letters, digits, ``_ - . / space``): ``eval/test/nDCG@10`` ->
    ``eval/test/nDCG_at_10``."""
    return re.sub(r"[^\w\-./ ]", "_", key.replace("@", "_at_"))


class WandbTracker:
    """A W&B run named ``<dataset>/<stage>`` in group ``<dataset>`` of `tracking.wandb_project`, its id fixed by the
    dataset and stage so that every job of the stage writes to the one run (``resume="allow"``); `tracking.wandb_mode`
    ``offline`` (the default) keeps it in the stage's ``wandb/`` folder for a later ``wandb sync``."""

    def __init__(self, run: TrackingRun, fresh: bool):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=run.wandb_project, group=run.dataset, name=run.name,
                              id=re.sub(r"[^A-Za-z0-9_-]", "-", run.name), resume="allow", mode=run.wandb_mode,
                              dir=str(run.folder), reinit="finish_previous")
        self.run.define_metric("*", step_metric="step")

    def log(self, values: Mapping[str, float], step: int) -> None:
        self.run.log({**values, "step": step})

    def close(self) -> None:
        self.run.finish()
        self.wandb.teardown()       # ends W&B's service process, which writes the run's last records as it ends


class Trackers:
    """Every backend of `tracking.backends`, each given the same scalars."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = trackers

    def log(self, values: Mapping[str, float], step: int) -> None:
        for tracker in self.trackers:
            tracker.log(values, step)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


BACKENDS = {"tensorboard": TensorBoardTracker, "mlflow": MlflowTracker, "wandb": WandbTracker}


def open_tracker(run: TrackingRun | Mapping | None, *, fresh: bool = False, main: bool = True) -> Tracker:
    """The tracker of a stage's run: :class:`NullTracker` when tracking is off or on any process but the main one
    (``main``); ``fresh``: a training that starts from step 0 (not one resumed from its checkpoint) starts the
    stage's run anew where the backend keeps runs apart (TensorBoard's events, MLflow's runs)."""
    run = TrackingRun.from_value(run)
    if run is None or not run.backends or not main:
        return NullTracker()
    check_installed({"tracking": {"backends": run.backends}})
    run.folder.mkdir(parents=True, exist_ok=True)
    return Trackers([BACKENDS[backend](run, fresh) for backend in run.backends])


def log_once(run: TrackingRun | Mapping | None, values: Mapping[str, float], step: int = 0) -> None:
    """``values`` into the stage's run (its newest one), then closed: the dev scores, an evaluation's metrics."""
    if not values:
        return
    tracker = open_tracker(run)
    try:
        tracker.log(values, step)
    finally:
        tracker.close()


def dev_scores(record: Mapping) -> dict[str, float]:
    """The dev selection's scores (``dev_selection.json``): ``dev/<metric>/{trained,start,handed_on}``; none where
    the trained model went on unchecked."""
    if "reason" in record:
        return {}
    return {f"dev/{record['metric']}/{name}": float(record[f"{name}_score"])
            for name in ("trained", "start", "handed_on")}


def evaluation_scalars(result: Mapping[str, Mapping[str, float]], target: str | None = None) -> dict[str, float]:
    """An evaluation's ``{split: {metric: value}}`` as ``eval/<split>/<metric>`` (``transfer/<target>/…`` for a
    transfer evaluation)."""
    prefix = f"transfer/{target}" if target else "eval"
    return {f"{prefix}/{split}/{metric}": float(value) for split, metrics in result.items()
            for metric, value in metrics.items()}

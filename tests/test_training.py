"""The training loop: learning, resume after a kill, and cross-device negatives with two gloo processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO, make_tiny_bert

from dpr_pipeline.data.corpus_shards import passage_text
from dpr_pipeline.data.passage_store import PassageStore, write_passage_store
from dpr_pipeline.data.schemas import read_artifact, to_table, write_artifact
from dpr_pipeline.errors import ConfigError
from dpr_pipeline.models.embedding import load_text_encoder
from dpr_pipeline.models.loading import load_encoder, load_tokenizer
from dpr_pipeline.retrieval.encode import encode_texts
from dpr_pipeline.training.distributed import check_processes, visible_gpus
from dpr_pipeline.training.groups import read_queries
from dpr_pipeline.training.launch import run_training
from dpr_pipeline.training.nodes import NODE_MODULE, RENDEZVOUS_PORTS, rendezvous_port
from dpr_pipeline.training.schedule import TrainingSettings, epochs_visited, total_steps
from dpr_pipeline.training.settings import BiEncoderSettings
from dpr_pipeline.training.stops import training_finished
from dpr_pipeline.training.trainer import batch_indices

SCRIPT = REPO / "tests" / "scripts" / "train_tiny_retriever.py"
TOPICS = ["cats purr", "dogs bark", "birds sing", "fish swim", "cows moo", "bees buzz", "owls hoot", "frogs croak"]


def write_training_data(root: Path) -> Path:
    """Eight queries, each with one relevant passage and passages about the other topics as negatives."""
    root.mkdir(parents=True, exist_ok=True)
    docs = [(f"d{i}", "", f"all about why {t} loudly") for i, t in enumerate(TOPICS)]
    docs += [(f"x{i}", "Extra", f"an unrelated passage number {i}") for i in range(8)]
    write_artifact(pd.DataFrame(docs, columns=["doc_id", "title", "text"]), root / "corpus.parquet", "corpus")
    write_passage_store(root / "corpus.parquet", root / "passages.arrow")
    write_artifact(pd.DataFrame([(f"q{i}", f"why do {t}") for i, t in enumerate(TOPICS)],
                                columns=["query_id", "text"]), root / "queries.parquet", "queries")
    rows = [{"query_id": f"q{i}", "positive_ids": [f"d{i}"], "positive_scores": [np.nan],
             "negative_ids": [f"d{j}" for j in range(8) if j != i] + [f"x{i}"],
             "negative_scores": [1.0] * 8} for i in range(8)]
    write_artifact(pd.DataFrame(rows), root / "negatives.parquet", "negatives")
    return root


def run_script(workdir: Path, output: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), str(workdir), str(output), *extra], cwd=REPO)


def losses(output: Path) -> list[float]:
    lines = output.with_suffix(".losses.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def test_batches_are_a_seeded_permutation_per_epoch():
    first = [batch_indices(10, 4, seed=1, step=s) for s in range(2)]
    assert [e for e, _ in first] == [0, 0] and len(set(first[0][1] + first[1][1])) == 8
    assert batch_indices(10, 4, 1, 2)[0] == 1            # 2 full batches per epoch
    assert batch_indices(10, 4, 1, 0) == batch_indices(10, 4, 1, 0)
    assert batch_indices(10, 4, 1, 0)[1] != batch_indices(10, 4, 2, 0)[1]
    assert total_steps(10, TrainingSettings(1e-5, 0, 4, epochs=1.5, min_steps=0)) == 3


def corpus_loss(model: Path, data: Path, temperature: float = 0.1) -> float:
    """Mean over the eight queries of −log softmax(cos(q, d) / τ) at the query's own passage, over all 16
    passages of the corpus: the model's retrieval loss on fixed data, computed on the CPU in float32 (so it
    measures what the model learned, wherever it was trained, without a mini-batch's draw of negatives)."""
    corpus, queries = read_artifact(data / "corpus.parquet", "corpus"), read_queries(data / "queries.parquet")
    encoder, tokenizer = load_text_encoder(str(model)), load_tokenizer(str(model))
    doc_ids = corpus["doc_id"].tolist()
    passages = [passage_text(title, text) for title, text in zip(corpus["title"], corpus["text"])]
    q = encode_texts(encoder, tokenizer, [queries[f"q{i}"] for i in range(len(TOPICS))], max_length=16,
                     batch_size=8, device="cpu")
    d = encode_texts(encoder, tokenizer, passages, max_length=24, batch_size=16, device="cpu")
    targets = torch.tensor([doc_ids.index(f"d{i}") for i in range(len(TOPICS))])
    return torch.nn.functional.cross_entropy(torch.from_numpy(q @ d.T) / temperature, targets).item()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_retriever_training_learns_and_saves_a_loadable_model(tmp_path, seed):
    """The claim is about the trained model, on fixed data, over several trajectories: the retrieval loss over
    the whole corpus falls below half the starting model's for every seed (measured on the CPU: 0.24 of it at
    most over seeds 1-6). A GPU's float rounding moves a trajectory as another seed's batch order does; the
    claim the test made before (the last four logged mini-batch losses below half the first four, with dropout
    on) held for seed 1 only: seeds 2-5 ended at 0.53-0.60 on the CPU too (seed 2: 3.72 -> 1.97; issue 23's
    GPU run: 3.70 -> 1.99). Dropout stays off: its masks come from the device's own RNG."""
    from sentence_transformers import SentenceTransformer

    tiny_bert = make_tiny_bert(tmp_path / "bert", dropout=0.0)
    data = write_training_data(tmp_path / "data")
    params = {"plm": str(tiny_bert), "learning_rate": 1e-2, "warmup_steps": 2, "batch_size": 4, "epochs": 20,
              "seed": seed, "save_steps": 100, "negatives_per_query": 3, "temperature": 0.1,
              "query_max_length": 16, "passage_max_length": 24, "min_steps": 0, "bf16": False}
    out, checkpoints, log = tmp_path / "model", tmp_path / "ckpt", tmp_path / "loss.jsonl"
    run_training("retriever1", 1, negatives_path=data / "negatives.parquet", passages_path=data / "passages.arrow",
                 queries_path=data / "queries.parquet", output_dir=out, checkpoint_dir=checkpoints, loss_log=log,
                 settings=BiEncoderSettings.from_params(params))
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, 41))
    before, after = corpus_loss(tiny_bert, data), corpus_loss(out, data)
    assert after < 0.5 * before, (before, after)
    assert np.mean([s["loss"] for s in steps[-4:]]) < np.mean([s["loss"] for s in steps[:4]])
    assert training_finished(checkpoints)              # the model is saved; the Snakemake run removes the folder
    assert (out / "model.safetensors").is_file()
    tokenizer = load_tokenizer(str(out))
    batch = tokenizer(["why do cats purr", "all about why cats purr loudly"], padding=True, return_tensors="pt")
    with torch.inference_mode():
        ours = load_text_encoder(str(out)).eval()(batch["input_ids"], batch["attention_mask"])
    theirs = SentenceTransformer(str(out), device="cpu").encode(
        ["why do cats purr", "all about why cats purr loudly"], convert_to_tensor=True)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_killed_training_resumes_to_the_same_weights(tmp_path):
    workdir = write_training_data(tmp_path)
    make_tiny_bert(workdir / "model", dropout=0.1)     # dropout on: the restored RNG state matters
    run_script(workdir, tmp_path / "straight.pt").wait(timeout=300)

    killed = run_script(workdir, tmp_path / "resumed.pt", "--slow", "0.2")
    state = tmp_path / "resumed.checkpoints" / "latest" / "state.pt"
    deadline = time.monotonic() + 300
    while not state.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    saved_step = torch.load(state, weights_only=True)["step"]
    assert 0 < saved_step < 4 and not (tmp_path / "resumed.pt").exists()   # 4 steps in all: killed mid-run

    assert run_script(workdir, tmp_path / "resumed.pt").wait(timeout=300) == 0
    straight, resumed = (torch.load(tmp_path / name, weights_only=True) for name in ("straight.pt", "resumed.pt"))
    for name in straight:
        torch.testing.assert_close(resumed[name], straight[name], rtol=0, atol=0, msg=name)
    assert losses(tmp_path / "resumed.pt") == losses(tmp_path / "straight.pt")


def test_processes_beyond_the_visible_gpus_is_an_error_naming_the_setting():
    """Issue 23: ``processes: 2`` on a one-GPU node died in rank 1's ``torch.cuda.set_device(1)`` (CUDA's
    ``invalid device ordinal``). The check, a pure function of the counts, runs before torchrun starts."""
    for processes, gpus in ((1, 0), (1, 1), (2, 0), (4, 0), (2, 2), (4, 8)):
        check_processes(processes, gpus, "retriever1")   # fits, or trains on the CPU (gloo) without a GPU
    with pytest.raises(ConfigError) as error:
        check_processes(2, 1, "retriever2")
    message = str(error.value)
    assert "retriever2 training" in message and "stages.retriever.processes is 2" in message
    assert "only 1 GPU is visible" in message and "to 1 or less" in message
    with pytest.raises(ConfigError, match="pretrain/simlm training: stages.pretrain.processes is 8 .* only 4 GPUs"):
        check_processes(8, 4, "pretrain/simlm")
    with pytest.raises(ConfigError, match=r"training: processes \(torchrun's --nproc_per_node\) is 3"):
        check_processes(3, 2, "training")


def fake_slurm_job(tmp_path: Path, monkeypatch) -> Path:
    """This process as a Slurm job's: ``srun`` on the PATH is tests/scripts/fake_srun.py (every node this machine),
    SLURM_JOB_ID one whose rendezvous port (:func:`rendezvous_port`) is free here. Returns the file srun's calls go
    to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{REPO / "tests" / "scripts" / "fake_srun.py"}" "$@"\n')
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SRUN_LOG", str(tmp_path / "srun.jsonl"))
    for job_id in range(os.getpid() % 1000, len(RENDEZVOUS_PORTS), 1000):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", rendezvous_port(job_id))) != 0:
                monkeypatch.setenv("SLURM_JOB_ID", str(job_id))
                return tmp_path / "srun.jsonl"
    pytest.skip("no free rendezvous port")


@pytest.mark.slow
def test_two_gloo_processes_on_one_node_or_two_match_one_process_over_the_joint_batch(tmp_path, monkeypatch):
    """run_training with 2 processes (gloo, cross-device negatives) = 1 process over the joint batch, step by step:
    on one node (torchrun --standalone) and over 2 "nodes" of one process each (srun, one torchrun per node joined
    by a c10d rendezvous; here both nodes are this machine, fake_srun.py)."""
    if visible_gpus() == 1:
        pytest.skip("one GPU visible: two processes are a ConfigError there (test_processes_beyond_the_visible_gpus"
                    "_is_an_error_naming_the_setting); this compares gloo on CPUs, or NCCL on 2+ GPUs")
    srun_calls = fake_slurm_job(tmp_path, monkeypatch)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")   # torchrun's default for 2 processes on a node, for 1 too
    if visible_gpus():                           # each "node" its own GPU (fake_srun.py)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(visible_gpus()))))
    data = write_training_data(tmp_path / "data")
    plm = make_tiny_bert(tmp_path / "bert", dropout=0.0)   # no dropout: both runs see identical forward passes
    params = {"plm": str(plm), "learning_rate": 1e-3, "warmup_steps": 2, "batch_size": 4, "epochs": 2, "seed": 3,
              "save_steps": 100, "negatives_per_query": 2, "temperature": 0.05, "query_max_length": 16,
              "passage_max_length": 24, "min_steps": 0, "bf16": False}
    runs = {"one": (1, 1), "two": (2, 1), "two_nodes": (2, 2)}           # name: processes, nodes
    for name, (processes, nodes) in runs.items():
        run_training("retriever1", processes, nodes=nodes, cpus_per_node=1,
                     negatives_path=str(data / "negatives.parquet"), passages_path=str(data / "passages.arrow"),
                     queries_path=str(data / "queries.parquet"), output_dir=str(tmp_path / name),
                     checkpoint_dir=str(tmp_path / f"{name}.ckpt"), loss_log=str(tmp_path / f"{name}.jsonl"),
                     settings=BiEncoderSettings.from_params(params))
    (srun,) = [json.loads(line) for line in srun_calls.open()]           # the two-node run's, one task per node
    assert srun[:3] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1"] and srun[-4:-1] == [NODE_MODULE, "2", "1"]
    logged = {name: [json.loads(line) for line in (tmp_path / f"{name}.jsonl").open()] for name in runs}
    assert [r["step"] for r in logged["one"]] == [1, 2, 3, 4]
    one_losses = [r["loss"] for r in logged["one"]]
    for name in ("two", "two_nodes"):
        assert [r["step"] for r in logged[name]] == [1, 2, 3, 4]
        assert [r["loss"] for r in logged[name]] == pytest.approx(one_losses, rel=1e-5), name
    # the same ranks with the same slices and threads, whether their torchruns share a node or not
    assert [r["loss"] for r in logged["two_nodes"]] == [r["loss"] for r in logged["two"]]
    start, one, two, two_nodes = (load_encoder(str(p)).state_dict() for p in (plm, *(tmp_path / n for n in runs)))
    # Adam turns float rounding in tiny gradients into steps of ~lr: compare with how far the weights moved. Nearly
    # every weight agrees within 2e-4; a float32 sum in another order (AVX2's vector width, not AVX512's) can move a
    # rare weight whose gradient is rounding noise by up to one step of the learning rate.
    assert max((one[n] - start[n]).abs().max().item() for n in one) > 1.5e-3
    apart = {name: (two[name] - one[name]).abs() for name in one}
    assert max(a.max().item() for a in apart.values()) <= params["learning_rate"]
    beyond = {name: int((a > 2e-4).sum()) for name, a in apart.items() if (a > 2e-4).any()}
    assert sum(beyond.values()) <= 1e-5 * sum(a.numel() for a in apart.values()), beyond
    for name in one:
        torch.testing.assert_close(two_nodes[name], two[name], atol=0, rtol=0,
                                   msg=lambda default: f"{name}: {default}")


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [1, 2], ids=["one node", "two nodes"])
def test_sigterm_to_a_two_process_run_saves_a_checkpoint_and_the_rerun_resumes_to_the_same_weights(tmp_path, nodes,
                                                                                                    monkeypatch):
    """Slurm signals every process of a job at its time limit: SIGTERM to the launcher, torchrun and both gloo
    workers (a process group here; over two "nodes" srun too, fake_srun.py) mid-run. The workers agree on the step
    to stop at, rank 0 saves it, the run fails; the rerun resumes from that step (not 0, no save_steps checkpoint
    before it) and ends with the weights and loss log of an uninterrupted two-process run."""
    if visible_gpus() == 1:
        pytest.skip("one GPU visible: two processes are a ConfigError there")
    if nodes > 1:
        fake_slurm_job(tmp_path, monkeypatch)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    data = write_training_data(tmp_path / "data")
    plm = make_tiny_bert(tmp_path / "bert", dropout=0.0)
    params = {"plm": str(plm), "learning_rate": 1e-3, "warmup_steps": 2, "batch_size": 4, "epochs": 6, "seed": 3,
              "save_steps": 100, "negatives_per_query": 2, "temperature": 0.05, "query_max_length": 16,
              "passage_max_length": 24, "min_steps": 0, "bf16": False}

    def spec(name):
        return {"negatives_path": str(data / "negatives.parquet"), "passages_path": str(data / "passages.arrow"),
                "queries_path": str(data / "queries.parquet"), "output_dir": str(tmp_path / name),
                "checkpoint_dir": str(tmp_path / f"{name}.ckpt"), "loss_log": str(tmp_path / f"{name}.jsonl"),
                "nodes": nodes, "cpus_per_node": 1}

    run_training("retriever1", 2, **spec("straight"), settings=BiEncoderSettings.from_params(params))
    (tmp_path / "spec.json").write_text(json.dumps({**spec("stopped"), "params": params}))
    scripts = REPO / "tests" / "scripts"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(scripts / "slow_steps"), str(REPO / "src")]),
           "SLOW_STEP_SECONDS": "0.5"}
    with open(tmp_path / "stopped.stderr", "w") as stderr:
        run = subprocess.Popen([sys.executable, str(scripts / "slow_training.py"), str(tmp_path / "spec.json")],
                               env=env, stderr=stderr, start_new_session=True)
    log = tmp_path / "stopped.ckpt" / "loss_log.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and run.poll() is None and (
            not log.exists() or len(log.read_text().splitlines()) < 3):
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGTERM)                       # every process, as Slurm does
    code = run.wait(timeout=120)
    output = (tmp_path / "stopped.stderr").read_text()
    assert code != 0, output[-3000:]
    step = torch.load(tmp_path / "stopped.ckpt" / "latest" / "state.pt", weights_only=True)["step"]
    assert 3 <= step < 12, output[-3000:]                    # 12 steps in all: stopped mid-run
    # both ranks stopped at the same step (each logs it once, then raises it)
    assert output.count(f"trainer: retriever stopped by SIGTERM at step {step} of 12") == 2, output[-3000:]
    assert not (tmp_path / "stopped").exists()

    run_training("retriever1", 2, **spec("stopped"), settings=BiEncoderSettings.from_params(params))
    straight, resumed = ([json.loads(line) for line in (tmp_path / f"{n}.jsonl").open()] for n in ("straight", "stopped"))
    assert [r["step"] for r in resumed] == list(range(1, 13))
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight]
    expected, weights = (load_encoder(str(tmp_path / n)).state_dict() for n in ("straight", "stopped"))
    for name in expected:
        torch.testing.assert_close(weights[name], expected[name], rtol=0, atol=0, msg=name)


def test_groups_name_the_file_row_of_an_unknown_document():
    from dpr_pipeline.errors import DataError
    from dpr_pipeline.training.groups import QueryGroups

    rows = to_table(pd.DataFrame({"query_id": ["q0", "q1"], "positive_ids": [["d0"], ["d1"]],
                                  "positive_scores": [[np.nan], [np.nan]], "negative_ids": [[], ["d404"]],
                                  "negative_scores": [[], [1.0]]}), "negatives")
    with pytest.raises(DataError, match="'d404' is not in the corpus") as err:
        QueryGroups(rows, PassageStore.of({"d0": "a", "d1": "b"}), {"q0": "x", "q1": "y"}, 1, 0, source="neg.parquet")
    assert err.value.row == 2                            # the file's row, though row 1 has no negative


def test_epochs_visited_counts_the_epochs_a_run_reaches():
    assert epochs_visited(100, batch_size=10, epochs=1, min_steps=0) == 1
    assert epochs_visited(100, batch_size=10, epochs=1.5, min_steps=0) == 2
    assert epochs_visited(100, batch_size=10, epochs=1, min_steps=25) == 3   # the floor: 25 steps of 10 per epoch
    assert epochs_visited(100, batch_size=10, epochs=1, min_steps=0, train_steps=11) == 2
    assert epochs_visited(105, batch_size=10, epochs=2, min_steps=0) == 2     # the last partial batch is dropped


def test_drawn_pairs_are_the_pairs_the_examples_read_and_only_they_need_scores():
    from dpr_pipeline.errors import DataError
    from dpr_pipeline.training.groups import QueryGroups

    store = PassageStore.of({f"d{i}": f"passage {i}" for i in range(10)})
    frame = pd.DataFrame({"query_id": ["q0", "q1", "q2"], "positive_ids": [["d0", "d1"], ["d2"], ["d3"]],
                          "positive_scores": [[1.0, 2.0], [3.0], [4.0]],
                          "negative_ids": [["d4", "d5", "d6", "d7"], ["d8", "d9", "d4"], []],
                          "negative_scores": [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7], []]})
    queries = {"q0": "x", "q1": "y", "q2": "z"}
    groups = QueryGroups(to_table(frame, "negatives"), store, queries, 2, 7, with_scores=True)
    positives, negatives = groups.drawn(2)
    read = {(groups.query_ids[i], d) for i in range(len(groups)) for e in range(2)
            for d in groups.example(i, e).passage_ids}
    flat_positive = [(q, d) for q, ids in zip(frame["query_id"], frame["positive_ids"]) for d in ids]
    flat_negative = [(q, d) for q, ids in zip(frame["query_id"], frame["negative_ids"]) for d in ids]
    assert {p for p, m in zip(flat_positive, positives) if m} | {n for n, m in zip(flat_negative, negatives) if m} \
        == read
    assert not positives[-1]                            # q2 has no negative: left out, draws nothing
    # a NaN where nothing is drawn is fine; on a drawn pair it is an error naming the row
    frame["positive_scores"] = [[np.nan if not m else s for s, m in zip(row, positives[o:o + len(row)])]
                                for row, o in zip(frame["positive_scores"], (0, 2, 3))]
    frame["negative_scores"] = [[np.nan if not m else s for s, m in zip(row, negatives[o:o + len(row)])]
                                for row, o in zip(frame["negative_scores"], (0, 4, 7))]
    QueryGroups(to_table(frame, "negatives"), store, queries, 2, 7, with_scores=True).check_scores(2)
    first_drawn = int(np.flatnonzero(negatives[4:7])[0])
    frame.at[1, "negative_scores"] = [np.nan if i == first_drawn else s
                                      for i, s in enumerate(frame.at[1, "negative_scores"])]
    with pytest.raises(DataError, match="draws in its 2 epoch") as err:
        QueryGroups(to_table(frame, "negatives"), store, queries, 2, 7, with_scores=True,
                    source="teacher.parquet").check_scores(2)
    assert (err.value.path, err.value.row) == ("teacher.parquet", 2)


def test_batches_made_ahead_are_the_steps_batches_and_an_error_reaches_the_step():
    from dpr_pipeline.training.trainer import _BatchesAhead

    made = []

    def make(step):
        made.append(step)
        if step == 3:
            raise ValueError("bad row in step 3")
        return step * 10

    ahead = _BatchesAhead(make, 1, 5)
    try:
        assert [ahead.take(1), ahead.take(2)] == [10, 20]
        with pytest.raises(ValueError, match="bad row in step 3"):
            ahead.take(3)
    finally:
        ahead.close()
    assert made[:3] == [1, 2, 3]


def test_the_loss_log_reads_the_device_every_few_steps_and_writes_every_step():
    import io

    from dpr_pipeline.training import trainer

    file, postfix = io.StringIO(), []

    class Progress:
        def set_postfix(self, **kwargs):
            postfix.append(kwargs["loss"])

    log = trainer._LossLog(file, Progress(), every=3)
    for step in range(1, 5):
        log.add(step, 0, torch.tensor(step / 10), 1e-5, float(step))
    assert len(file.getvalue().splitlines()) == 3 and postfix == ["0.3000"]   # step 4 still on the device
    log.write()
    lines = [json.loads(line) for line in file.getvalue().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4] and lines[3]["loss"] == pytest.approx(0.4)
    assert postfix[-1] == "0.4000"

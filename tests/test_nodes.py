"""A training over several nodes (training/nodes.py): the Slurm hostlist's first host, the rendezvous every node
derives alike, the srun and torchrun commands, and the errors that stop such a training before it starts.
The training itself over two "nodes": tests/test_training.py (test_two_gloo_processes_on_one_node_or_two_...)."""

import sys

import pytest

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.training.launch import run_training
from dpr_pipeline.training.nodes import (NODE_MODULE, RENDEZVOUS_PORTS, WORKER_MODULE, Rendezvous,
                                         first_host, processes_per_node, rendezvous_port, require_slurm_job,
                                         slurm_rendezvous, srun_command, torchrun_command)


@pytest.mark.parametrize("nodelist, host", [("gpu[01-04]", "gpu01"), ("gpu[3,5-6],cpu1", "gpu3"),
                                            ("node7,node9", "node7"), ("n[008-010]", "n008"), ("g17", "g17"),
                                            ("rack[1-2]-n[3-4]", "rack1-n3"), ("a-1.b_2[7]", "a-1.b_27")])
def test_the_first_host_of_a_slurm_hostlist(nodelist, host):
    assert first_host(nodelist) == host


@pytest.mark.parametrize("text", ["", "gpu[01-", "gpu[a-b]", ",gpu1", "gpu 1"])
def test_a_text_that_is_no_hostlist_is_refused(text):
    with pytest.raises(ValueError, match="is not a Slurm hostlist"):
        first_host(text)


def test_every_node_of_a_job_derives_the_same_rendezvous_and_jobs_differ():
    environ = {"SLURM_JOB_ID": "4817", "SLURM_STEP_NODELIST": "gpu[12-15]", "SLURM_STEP_NUM_NODES": "4"}
    assert slurm_rendezvous({**environ, "SLURM_NODEID": "3"}, 4) == slurm_rendezvous(environ, 4) \
        == Rendezvous("gpu12", rendezvous_port(4817), "4817")
    assert slurm_rendezvous(environ, 4).endpoint == f"gpu12:{rendezvous_port(4817)}"
    ports = [rendezvous_port(job) for job in range(123456, 123456 + len(RENDEZVOUS_PORTS))]
    assert len(set(ports)) == len(RENDEZVOUS_PORTS) and set(ports) <= set(RENDEZVOUS_PORTS)
    assert max(RENDEZVOUS_PORTS) < 32768                   # below Linux's ephemeral ports


def test_a_rendezvous_outside_a_step_of_the_training_s_nodes_is_an_error():
    with pytest.raises(ConfigError, match="SLURM_STEP_NODELIST, SLURM_STEP_NUM_NODES are not set"):
        slurm_rendezvous({"SLURM_JOB_ID": "7"}, 2)
    with pytest.raises(ConfigError, match="runs on 3 nodes .gpu.1-3.., not the training's 4"):
        slurm_rendezvous({"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "gpu[1-3]", "SLURM_STEP_NUM_NODES": "3"}, 4)


def test_one_node_stays_standalone_and_several_join_a_c10d_rendezvous():
    run = [sys.executable, "-m", "torch.distributed.run"]
    assert torchrun_command(4, "spec.json") == [*run, "--standalone", "--nproc_per_node", "4", "-m", WORKER_MODULE,
                                                "spec.json"]
    rendezvous = Rendezvous("gpu01", 24817, "4817")
    assert torchrun_command(2, "spec.json", 4, rendezvous) == [
        *run, "--nnodes", "4", "--rdzv_backend", "c10d", "--rdzv_endpoint", "gpu01:24817", "--rdzv_id", "4817",
        "--nproc_per_node", "2", "-m", WORKER_MODULE, "spec.json"]
    with pytest.raises(ValueError, match="needs their rendezvous"):
        torchrun_command(2, "spec.json", 4)


def test_the_launcher_starts_one_task_per_node_with_the_job_s_cpus_and_gpus():
    assert srun_command(4, 2, 16, "/shared/spec.json") == [
        "srun", "--nodes=4", "--ntasks=4", "--ntasks-per-node=1", "--cpus-per-task=16", "--gres=gpu:2",
        "--kill-on-bad-exit=1", sys.executable, "-m", NODE_MODULE, "4", "2", "/shared/spec.json"]


def test_processes_must_split_evenly_over_the_nodes():
    assert [processes_per_node(8, nodes, "stages.pretrain.nodes") for nodes in (1, 2, 4, 8)] == [8, 4, 2, 1]
    with pytest.raises(ConfigError, match=r"stages.pretrain.nodes: 3 nodes cannot share 8 processes evenly .* one "
                                          r"of \[1, 2, 4, 8\]"):
        processes_per_node(8, 3, "stages.pretrain.nodes")


def test_a_training_over_nodes_outside_a_slurm_job_stops_before_it_starts(tmp_path, monkeypatch):
    """No silent training on one node when several were asked: outside a Slurm job (a laptop, a local run), or
    where srun is missing, the error names the stage's setting and the fix, before any process starts."""
    with pytest.raises(ConfigError, match=r"retriever1 training: stages.retriever.nodes is 2: .* but this process "
                                          r"is not in a Slurm job \(no SLURM_JOB_ID\)\. Fix: .*--profile slurm"):
        require_slurm_job({"PATH": "/usr/bin"}, 2, "retriever1", "stages.retriever.nodes")
    with pytest.raises(ConfigError, match="but srun is not on the PATH"):
        require_slurm_job({"SLURM_JOB_ID": "7", "PATH": str(tmp_path)}, 2, "retriever1", "stages.retriever.nodes")
    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\n")
    srun.chmod(0o755)
    require_slurm_job({"SLURM_JOB_ID": "7", "PATH": str(tmp_path)}, 2, "retriever1", "stages.retriever.nodes")

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)   # as on a laptop, whatever runs the tests
    checkpoints = tmp_path / "checkpoints"
    with pytest.raises(ConfigError, match="pretrain/simlm training: stages.pretrain.nodes is 2"):
        run_training("pretrain/simlm", 4, nodes=2, cpus_per_node=4,
                     checkpoint_dir=str(checkpoints))
    with pytest.raises(ConfigError, match="stages.reranker.nodes: 3 nodes cannot share 4 processes"):
        run_training("reranker", 4, nodes=3, cpus_per_node=4, checkpoint_dir=str(checkpoints))
    assert not checkpoints.exists()                      # nothing started

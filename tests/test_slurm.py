"""The `slurm` profile against a real Slurm: the bundled SciFact chain through `snakemake --profile slurm`.

scripts/slurm/start brings up a one-node Slurm on this machine (Slurm 22.05, MUNGE, slurmdbd + MariaDB from
apt; set up as a typical GPU site: a 60-minute GPU partition, 4 count-only GPUs per node (GPU rules' `--gpus`
requests schedule, their jobs then running on the CPU), an account required, MaxSubmitJobs, no internet in jobs).
The test runs, in a copy of the repository and from its root, exactly the command users run:

    snakemake --profile slurm results/scifact/retriever1/metrics.json

(ingestion, BM25, Retriever 1 trained, the corpus encoded in 2 shards, indexed, searched, evaluated: 12 jobs;
DPR_SLURM_TEST_TARGET=results/scifact/distill/metrics.json runs the whole chain, 28 jobs, about 11 minutes
on 2 cores) with a tiny config (2-layer random BERTs, small resources), jobs in this venv (the profile's
default: no conda) and the first status check after 2 s instead of 40
(--slurm-init-seconds-before-status-checks). It checks that every job went through sbatch and finished in
Slurm's accounting, that GPU rules asked for GPUs and CPU rules for none, that the retriever was trained by
torchrun with 2 processes in a job given 2 GPUs, and that a job made to fail once (an injected fault: its
script exits non-zero on the first attempt) is resubmitted with twice the memory and the run completes. Skipped, with
the reason, where Slurm cannot be started (not root, no apt-get).
The Slurm job ids and the sacct table go to logs/slurm_test.log (.ci/run prints it).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, copy_repo, make_tiny_bert, planned_jobs, slurm_dry_run, tiny_scifact_config

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

TARGET = os.environ.get("DPR_SLURM_TEST_TARGET", "results/scifact/retriever1/metrics.json")
FAULTY_RULE = "bm25_negatives"
FAULT = '''# Injected by tests/test_slurm.py: fail the first attempt, succeed on the retry.
import os as _os
from pathlib import Path as _Path
_marker = _Path("injected_fault_attempts.txt")
_marker.write_text(_marker.read_text() + _os.environ.get("SLURM_JOB_ID", "?") + "\\n" if _marker.exists()
                   else _os.environ.get("SLURM_JOB_ID", "?") + "\\n")
if len(_marker.read_text().split()) == 1:
    raise SystemExit("injected fault: first attempt fails")
'''
LOG = REPO / "logs" / "slurm_test.log"
#: Snakemake's line for each sbatch submission (group: the Slurm job id)
SUBMITTED = r"has been submitted with SLURM jobid (\d+)"


#: The test cluster (scripts/slurm/start: a typical site's partitions, 60-minute GPU limit, 4 GPUs per node, an
#: account required), as a user describes it in the config's cluster block.
CLUSTER = {"cpu_partition": "cpu", "gpu_partition": "gpu", "account": "dprlab", "max_runtime": 60}


@pytest.fixture(scope="module")
def slurm():
    start = REPO / "scripts" / "slurm" / "start"
    if os.geteuid() != 0 and not shutil.which("sudo"):
        pytest.skip("Slurm cannot be started here: scripts/slurm/start needs root (or sudo)")
    if not shutil.which("apt-get") and not shutil.which("slurmctld"):
        pytest.skip("Slurm cannot be started here: no Slurm installed and no apt-get to install it")
    began = time.monotonic()
    done = subprocess.run([str(start)], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.skip(f"Slurm cannot be started here: scripts/slurm/start failed:\n{done.stderr[-2000:]}")
    return {"start_seconds": time.monotonic() - began, "sinfo": done.stdout}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of the repository (what a user has on the cluster), with the fault injected and a tiny config."""
    root = copy_repo(tmp_path_factory.mktemp("slurm") / "repo")
    script = root / "workflow_scripts" / f"{FAULTY_RULE}.py"
    script.write_text(FAULT + script.read_text())
    config = tiny_scifact_config(str(make_tiny_bert(root / "tiny_bert")))
    config["run_datasets"] = ["scifact"]
    config["cluster"] = CLUSTER
    stages = config["datasets"]["scifact"]["stages"]
    stages["reranker"].update(teacher_shards=2, score_batch_size=256)
    stages["retriever"].update(processes=2)        # 2-GPU training jobs: torchrun --nproc_per_node 2
    # Small jobs for a 2-CPU node: 1 thread, 2 GB, 30 minutes each (a retry doubles memory and runtime).
    config["datasets"]["scifact"]["resources"] = {"default": {"threads": 1, "mem_mb": 2000, "runtime": 30}}
    (root / "tiny.yaml").write_text(yaml.safe_dump(config))
    return root


@pytest.fixture(scope="module")
def run(slurm, checkout):
    command = [sys.executable, "-m", "snakemake", "--profile", "slurm", TARGET, "--configfile", "tiny.yaml",
               "--slurm-init-seconds-before-status-checks", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DPR_PIPELINE_ALLOW_CPU": "1",  # fake GPUs
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    began = time.monotonic()
    done = subprocess.run(command, cwd=checkout, capture_output=True, text=True, env=env, timeout=1800)
    seconds = time.monotonic() - began
    output = done.stdout + done.stderr
    # a job's id, or a group's (a UUID: the shard jobs the profile groups, stages.SHARD_GROUPS)
    submitted = re.findall(rf"Job (\S+) {SUBMITTED}", output)
    accounting = subprocess.run(["sacct", "-X", "-P", "-n", "-o", "JobID,JobName,State,ExitCode,AllocTRES,Partition",
                                 "-j", ",".join(j for _, j in submitted) or "0"],
                                capture_output=True, text=True).stdout
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text(f"$ {' '.join(command)}   (in a copy of the repository, {checkout})\n"
                   f"Slurm started in {slurm['start_seconds']:.0f} s; workflow {seconds:.0f} s, exit "
                   f"{done.returncode}; {len(submitted)} sbatch submissions\n\n"
                   f"{slurm['sinfo']}\nSnakemake job -> Slurm job id:\n"
                   + "".join(f"  {job} -> {slurm_id}\n" for job, slurm_id in submitted)
                   + f"\nsacct (JobID|JobName|State|ExitCode|AllocTRES|Partition):\n{accounting}\n"
                   + ("" if done.returncode == 0 else f"\nSnakemake output (tail):\n{output[-8000:]}\n"))
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed after {seconds:.0f} s:\n{output[-8000:]}")
    return {"output": output, "submitted": submitted, "sacct": accounting, "root": checkout}


def planned(root):
    """Jobs of the run, from a dry run of the same command (Snakemake job stats)."""
    done = slurm_dry_run(root, TARGET, "--configfile", "tiny.yaml", "--forceall")
    assert done.returncode == 0, done.stderr[-4000:]
    return planned_jobs(done.stdout)


def test_every_job_goes_through_sbatch_and_the_target_appears(run):
    """Every job once, the faulty one twice, all with a Slurm job id, none run locally; each stage's encoding shards
    (2) in one sbatch, run one after the other on one GPU in their summed time (the profile's group-components)."""
    root = run["root"]
    assert (root / TARGET).is_file()
    jobs = planned(root)
    groups = [job for job, _ in run["submitted"] if not job.isdigit()]
    assert sorted(re.findall(r"Group job (\S+) \(", run["output"])) == ["encode_corpus_scifact_retriever1",
                                                                      "encode_corpus_scifact_start"]
    assert len(groups) == 2 and jobs["encode_corpus"] == 2 * 2
    assert len(run["submitted"]) == sum(jobs.values()) + 1 - jobs["encode_corpus"] + len(groups)
    assert "localrule" not in run["output"]
    states = [line.split("|") for line in run["sacct"].splitlines() if line]
    assert len(states) == len(run["submitted"])
    assert sorted(s[2] for s in states).count("COMPLETED") == len(states) - 1
    assert [s[2] for s in states].count("FAILED") == 1
    in_groups = subprocess.run(["sacct", "-X", "-P", "-n", "-o", "Timelimit,AllocTRES", "-j",
                                ",".join(slurm_id for job, slurm_id in run["submitted"] if job in groups)],
                               capture_output=True, text=True).stdout.split()
    assert len(in_groups) == 2 and all(line.startswith("01:00:00|") and "gres/gpu=1," in line for line in in_groups)


def test_the_injected_fault_is_retried_with_more_memory(run):
    root = run["root"]
    attempts = (root / "injected_fault_attempts.txt").read_text().split()
    assert len(attempts) == 2                                  # failed once, then succeeded
    failed, retried = attempts
    rows = {r.split("|")[0]: r.split("|") for r in run["sacct"].splitlines() if r}
    assert rows[failed][2] == "FAILED" and rows[retried][2] == "COMPLETED"
    memory = subprocess.run(["sacct", "-X", "-P", "-n", "-o", "JobID,ReqMem", "-j", f"{failed},{retried}"],
                            capture_output=True, text=True).stdout
    requested = dict(line.split("|") for line in memory.splitlines() if line)
    assert requested[failed].rstrip("M") == "2000" and requested[retried].rstrip("M") == "4000"
    assert (root / "results" / "scifact" / "bm25" / "negatives.parquet").is_file()


def test_gpu_rules_request_gpus_and_training_uses_one_process_per_gpu(run):
    rows = [r.split("|") for r in run["sacct"].splitlines() if r]
    with_gpus = [(alloc, partition) for _, _, _, _, alloc, partition in rows if "gres/gpu=" in alloc]
    assert any("gres/gpu=2" in alloc for alloc, _ in with_gpus)   # train_retriever: processes 2
    assert any("gres/gpu=1" in alloc for alloc, _ in with_gpus)   # encoding, search
    assert {partition for _, partition in with_gpus} == {"gpu"}   # config cluster.gpu_partition
    cpu_jobs = [partition for _, _, _, _, alloc, partition in rows if "gres/gpu=" not in alloc]
    assert cpu_jobs and set(cpu_jobs) == {"cpu"}                  # CPU rules: no GPUs, the cpu partition
    # torchrun's processes log to the job's Slurm log (logs/slurm/, kept by the profile)
    logs = [p.read_text() for p in (run["root"] / "logs" / "slurm").rglob("*.log") if "train_retriever" in str(p)]
    assert any(re.search(r"\d+ steps of \d+, 2 process\(es\)", text) for text in logs), logs


def test_the_preflight_refuses_what_the_cluster_cannot_run_before_submitting_anything(slurm, checkout):
    """On the typical test cluster, a config asking 8 GPUs on its 4-GPU nodes, more time than the gpu partition's
    60 minutes (no cap) and another lab's account: the run stops before its first sbatch, each refusal naming
    the setting that fixes it (the run with the config fixed is the `run` fixture's)."""
    (checkout / "too_big.yaml").write_text(yaml.safe_dump({
        "cluster": {**CLUSTER, "max_runtime": None, "account": "physics"},
        "datasets": {"scifact": {"stages": {"retriever": {"processes": 8}},
                                 "resources": {"train_retriever": {"runtime": 120}}}}}))
    command = [sys.executable, "-m", "snakemake", "--profile", "slurm", TARGET, "--configfile", "tiny.yaml",
               "too_big.yaml"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(command, cwd=checkout, capture_output=True, text=True, env=env, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "has been submitted with SLURM jobid" not in output
    assert "the cluster cannot run this plan as configured; nothing was submitted" in output
    assert "cluster.account is 'physics', which is not an account of user" in output
    assert ("rule train_retriever (dataset scifact): asks 8 GPUs on one node; a node of the GPU partition has 4; "
            "fix: set datasets.scifact.stages.retriever.processes: 4") in output
    assert ("rule train_retriever (dataset scifact): asks 120 min; partition gpu allows 60 (sinfo %l); fix: set "
            "cluster.max_runtime: 60") in output
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a") as log:
        log.write(f"\n$ {' '.join(command)}   (the preflight on the typical test cluster)\nexit {done.returncode}\n"
                  + "\n".join(line for line in output.splitlines() if line.strip().startswith("- ")
                               or "cannot run this plan" in line) + "\n")


# --- a training longer than its time limit: SIGTERM -> checkpoint -> the retry resumes -------------------------

TIME_LIMIT_TARGET = "results/scifact/retriever1/manifest.json"
TRAIN_STEPS = 200       # more than one minute holds at 0.4 s a step (150): the time limit always comes first
REQUEUE_STEPS = 100     # at least 40 s: the requeue, 20 s into the training, comes before its end
SLOW_STEPS = '''

# Injected by tests/test_slurm.py: every optimizer step 0.4 s longer, so that this training outlasts its job's
# one-minute time limit.
_optimizer_step_in_time = _optimizer_step


def _optimizer_step(*args, **kwargs):
    time.sleep(0.4)
    return _optimizer_step_in_time(*args, **kwargs)
'''


def slow_training(root: Path, steps: int) -> dict:
    """The `run` fixture's checkout ``root``, after its run, made to train Retriever 1 again, slowly: ``steps`` steps
    (SLOW_STEPS, injected into the checkout's trainer) by torchrun with 2 processes, no save_steps checkpoint
    before the end (slow.yaml, given after tiny.yaml). As a user who changes the stage's settings, the next run
    trains it again from what the first run left (ingestion, BM25 negatives: not run again). Returns the
    environment that runs it: the checkout's package first on the path of Snakemake and of the Slurm
    jobs, which inherit it, as where the checkout is the installed one."""
    trainer = root / "src" / "dpr_pipeline" / "training" / "trainer.py"
    if SLOW_STEPS not in trainer.read_text():
        trainer.write_text(trainer.read_text() + SLOW_STEPS)
    (root / "slow.yaml").write_text(yaml.safe_dump({"datasets": {"scifact": {"stages": {"retriever": {
        "train_steps": steps, "save_steps": 10 * steps}}}}}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DPR_PIPELINE_ALLOW_CPU": "1",  # fake GPUs
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(root / "src")}
    return env


def training_logs(root: Path, job_ids=None) -> list[Path]:
    """train_retriever's Slurm logs in the checkout ``root``, in submission order: all of them, or those of the Slurm
    jobs ``job_ids`` (the checkout's earlier runs leave theirs beside a run's)."""
    logs = (root / "logs" / "slurm" / "rule_train_retriever").rglob("*.log")
    return sorted((p for p in logs if job_ids is None or p.stem in job_ids), key=lambda p: int(p.stem))


@pytest.fixture(scope="module")
def time_limit_run(slurm, run):
    """In the `run` fixture's checkout (slow_training): Retriever 1 trains TRAIN_STEPS steps (0.4 s longer each) by
    torchrun with 2 processes in a 2-GPU job with a one-minute time limit (time_limit.yaml: resources runtime 1;
    each continuation gets the same minute, and the same memory). No save_steps checkpoint comes before the end: the
    only one is the one saved on Slurm's SIGTERM at the limit (the test cluster's KillWait: 5 s)."""
    root = run["root"]
    env = slow_training(root, TRAIN_STEPS)
    (root / "time_limit.yaml").write_text(yaml.safe_dump({"datasets": {"scifact": {"resources": {
        "train_retriever": {"runtime": 1}}}}}))
    command = [sys.executable, "-m", "snakemake", "--profile", "slurm", TIME_LIMIT_TARGET, "--configfile",
               "tiny.yaml", "slow.yaml", "time_limit.yaml", "--slurm-init-seconds-before-status-checks", "2",
               "--retries", "3",
               # the profile's SIGTERM 2 minutes early would come at once in a one-minute job: Slurm's own at the
               # time limit instead (the harder case: KillWait seconds to save)
               "--set-resources", "train_retriever:slurm_extra=''"]
    began = time.monotonic()
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, env=env, timeout=1800)
    output = done.stdout + done.stderr
    logs = training_logs(root, re.findall(SUBMITTED, output))
    accounting = subprocess.run(["sacct", "-X", "-P", "-n", "-o", "JobID,State,ExitCode,Timelimit,Elapsed,AllocTRES,Partition",
                                 "-j", ",".join(p.stem for p in logs) or "0"], capture_output=True, text=True).stdout
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a") as log:
        log.write(f"\n\n$ {' '.join(command)}   (time-limit test, in {root}; {time.monotonic() - began:.0f} s, exit "
                  f"{done.returncode})\ntrain_retriever's jobs (JobID|State|ExitCode|Timelimit|Elapsed|AllocTRES|Partition):\n"
                  f"{accounting}\n" + "".join(f"--- {p.name} (stop/resume lines)\n" + "".join(
                      line + "\n" for line in p.read_text().splitlines() if "SIGTERM" in line or "resuming" in line)
                      for p in logs))
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed:\n{output[-8000:]}")
    return {"root": root, "output": output, "logs": [p.read_text() for p in logs],
            "sacct": [line.split("|") for line in accounting.splitlines() if line]}


def test_a_training_stopped_at_its_time_limit_saves_a_checkpoint_and_the_retry_resumes_from_it(time_limit_run):
    first, *_, last = time_limit_run["logs"]
    states = [row[1] for row in time_limit_run["sacct"]]
    assert len(states) >= 2 and states[0] == "TIMEOUT" and states[-1] == "COMPLETED", time_limit_run["sacct"]
    assert time_limit_run["sacct"][0][3] == "00:01:00" and all("gres/gpu=2" in row[5] for row in time_limit_run["sacct"])
    # each continuation asks what the first attempt asked: a time limit is no failure (orchestration/resources.py)
    assert {row[3] for row in time_limit_run["sacct"]} == {"00:01:00"}, time_limit_run["sacct"]
    assert len({re.search(r"mem=[^,]+", row[5]).group() for row in time_limit_run["sacct"]}) == 1
    assert all(row[6] == "gpu" for row in time_limit_run["sacct"])
    stopped = [int(step) for step in re.findall(rf"retriever stopped by SIGTERM at step (\d+) of {TRAIN_STEPS}",
                                                first)]
    # both torchrun processes stopped at the same step, mid-run
    assert len(stopped) >= 2 and len(set(stopped)) == 1 and 0 < stopped[0] < TRAIN_STEPS, first[-3000:]
    resumed = re.findall(rf"resuming retriever from checkpoint step (\d+) of {TRAIN_STEPS}", time_limit_run["logs"][1])
    assert resumed and int(resumed[0]) == stopped[0], time_limit_run["logs"][1][-3000:]   # not from step 0
    loss_log = time_limit_run["root"] / "results" / "scifact" / "retriever1" / "loss_log.jsonl"
    steps = [json.loads(line)["step"] for line in loss_log.read_text().splitlines()]
    assert steps == list(range(1, TRAIN_STEPS + 1))
    assert "2 process(es)" in last
    # the changed settings ran Retriever 1's training again, nothing before it (the `run` fixture's outputs)
    assert len(re.findall(SUBMITTED, time_limit_run["output"])) == len(
        time_limit_run["logs"])


@pytest.fixture(scope="module")
def requeued_run(slurm, time_limit_run):
    """As the time-limit run, in the same checkout with a 30-minute limit (tiny.yaml's) and REQUEUE_STEPS steps
    (a changed setting: Retriever 1 is trained again): once its training has run 20 s, its job is requeued (`scontrol requeue`, as
    a preemption with PreemptMode=REQUEUE does): Slurm stops it with SIGTERM and queues it again under the same
    job id, Snakemake keeps waiting for it, and the training resumes from the checkpoint it saved on the SIGTERM."""
    root = time_limit_run["root"]
    env = slow_training(root, REQUEUE_STEPS)
    # the time-limit run's success removed its finished checkpoint (orchestration/checkpoints.py): this training
    # starts from step 0
    assert not (root / "results" / "scifact" / "checkpoints" / "retriever1").exists()
    command = [sys.executable, "-m", "snakemake", "--profile", "slurm", TIME_LIMIT_TARGET, "--configfile",
               "tiny.yaml", "slow.yaml", "--slurm-init-seconds-before-status-checks", "2"]
    earlier = set(training_logs(root))
    process = subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env)
    requeued, deadline = None, time.monotonic() + 1200
    while requeued is None and process.poll() is None and time.monotonic() < deadline:
        time.sleep(2)
        logs = set(training_logs(root)) - earlier
        if logs and re.search(r"\d+ steps of \d+, 2 process\(es\)", next(iter(logs)).read_text()):
            time.sleep(20)                                           # some steps into the training
            requeued = next(iter(logs)).stem
            subprocess.run(["scontrol", "requeue", requeued], check=True)
    output, _ = process.communicate(timeout=1800)
    assert requeued is not None, output[-6000:]
    accounting = subprocess.run(["sacct", "-P", "-n", "-D", "-X", "-o", "JobID,State,Elapsed,AllocTRES",
                                 "-j", requeued], capture_output=True, text=True).stdout
    with LOG.open("a") as log:
        log.write(f"\n\n$ {' '.join(command)}   (requeue test, in {root}; job {requeued} requeued, exit "
                  f"{process.returncode})\nsacct -D (every run of the job):\n{accounting}\n")
    if process.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed:\n{output[-8000:]}")
    log, = training_logs(root, [requeued])
    return {"root": root, "output": output, "job": requeued, "sacct": accounting, "log": log.read_text()}


def test_a_requeued_training_resumes_from_the_checkpoint_it_saved_on_sigterm(requeued_run):
    runs = [line.split("|") for line in requeued_run["sacct"].splitlines() if line]
    assert [state for _, state, *_ in runs][-1] == "COMPLETED" and len(runs) >= 2, runs   # requeued, then completed
    submitted = re.findall(SUBMITTED, requeued_run["output"])
    assert submitted.count(requeued_run["job"]) == 1                # one submission: Slurm ran it again
    resumed = re.findall(rf"resuming retriever from checkpoint step (\d+) of {REQUEUE_STEPS}", requeued_run["log"])
    assert resumed and 0 < int(resumed[0]) < REQUEUE_STEPS, requeued_run["log"][-3000:]
    loss_log = requeued_run["root"] / "results" / "scifact" / "retriever1" / "loss_log.jsonl"
    assert [json.loads(line)["step"] for line in loss_log.read_text().splitlines()] == list(range(1, REQUEUE_STEPS + 1))

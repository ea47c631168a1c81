"""The site file (orchestration/cluster_site.py): the cluster block read by every run without --configfile, the
command line winning over it, the preflight's fixes naming it, on a typical cluster's own words (sinfo, scontrol,
sacctmgr output)."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.orchestration.cluster_facts import read_cluster_facts
from dpr_pipeline.orchestration.cluster_site import SITE_ENV, site_file, site_label, site_overrides
from dpr_pipeline.orchestration.preflight import JobRequest, refusals

# A typical site: a CPU partition (the default, 2 days), a GPU partition of 4-GPU A100 nodes (12 h) that only takes
# two QoS, a short debug partition with 2 untyped GPUs; user alice has one account.
SINFO_PARTITIONS = "cpu*|2-00:00:00|up\ngpu|12:00:00|up\ndebug|30:00|up\n"
SINFO_NODES = ("cpu|c001|64|256000|(null)\ncpu|c002|64|256000|(null)\n"
               "gpu|g001|64|512000|gpu:a100:4(S:0-1)\ngpu|g002|64|512000|gpu:a100:4(S:0-1)\n"
               "debug|g003|32|128000|gpu:2\n")
SCONTROL_PARTITIONS = (
    "PartitionName=cpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL Default=YES QoS=N/A MaxTime=2-00:00:00 "
    "Nodes=c[001-002] State=UP TotalCPUs=128\n"
    "PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=gpu-short,gpu-long Default=NO QoS=N/A "
    "MaxTime=12:00:00 Nodes=g[001-002] State=UP TotalCPUs=128 TRES=cpu=128,mem=1000G,node=2,gres/gpu=8\n"
    "PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL Default=NO QoS=N/A MaxTime=00:30:00 "
    "Nodes=g003 State=UP\n")
ANSWERS = {
    "sinfo -h -N": SINFO_NODES,
    "sinfo -h": SINFO_PARTITIONS,
    "sacctmgr -nP show assoc user=alice format=account,maxsubmit": "ir-lab|80\n",
    "sacctmgr -nP show assoc user=alice format=account,qos": "ir-lab|normal,gpu-short\n",
    "sacctmgr -nP show qos": "normal|\ngpu-short|1-00:00:00\ngpu-long|3-00:00:00\n",
    "scontrol show config": "AccountingStorageEnforce = associations,limits,qos\nClusterName = uni\n",
    "scontrol -o show partition": SCONTROL_PARTITIONS,
}


def slurm(answers):
    """A subprocess.run answering each command by the longest of ``answers``' command lines it starts with;
    others: not found (no such command)."""
    def run(command, **_):
        for prefix in sorted(answers, key=len, reverse=True):
            if command[:len(prefix.split())] == prefix.split():
                return subprocess.CompletedProcess(command, 0, answers[prefix], "")
        raise FileNotFoundError(command[0])
    return run


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working directory without a site file, and no $DPR_PIPELINE_SITE."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(SITE_ENV, raising=False)
    return tmp_path


# ------------------------------------------------------------------------------------ the run reads the site
def test_the_site_file_is_site_yaml_here_or_the_one_the_environment_names(workdir, monkeypatch):
    assert site_file() is None and site_label() == "site.yaml (none yet: `make site` writes one)"
    (workdir / "site.yaml").write_text("cluster: {account: ir-lab}\n")
    assert site_file().resolve() == (workdir / "site.yaml").resolve() and site_label() == "site.yaml"
    monkeypatch.setenv(SITE_ENV, str(workdir / "elsewhere.yaml"))
    with pytest.raises(ConfigError, match=f"{SITE_ENV}=.*elsewhere.yaml: no such file.*Fix: point {SITE_ENV} at"):
        site_file()
    assert site_label() == f"{workdir / 'elsewhere.yaml'} (none yet: `make site` writes one)"


def test_the_command_lines_cluster_keys_win_and_are_named():
    site = {"cluster": {"account": "ir-lab", "gpu_partition": "gpu"}}
    assert site_overrides(site, {"cluster": {"account": "physics", "qos": "long"}}) == ["cluster.account"]
    assert site_overrides(site, {"datasets": {}}) == []


def test_the_snakefile_reads_the_site_file_and_a_configfile_wins_over_it(tmp_path):
    """The parsed workflow (scripts/dag_plan.py --rules, from the repository root): the site file's partitions on
    the rules without any --configfile; a --configfile's cpu_partition wins over the site file's."""
    (tmp_path / "site.yaml").write_text("cluster:\n  gpu_partition: gpu-site\n  cpu_partition: cpu-site\n")
    (tmp_path / "cli.yaml").write_text("cluster: {cpu_partition: cpu-cli}\n")

    def partitions(*configfile) -> set:
        done = subprocess.run([sys.executable, "scripts/dag_plan.py", "--rules", *configfile], cwd=REPO,
                              capture_output=True, text=True, env={**os.environ, SITE_ENV: str(tmp_path / "site.yaml")})
        assert done.returncode == 0, done.stderr[-3000:]
        rules = json.loads(done.stdout)
        return {(rules[rule]["gpu"] not in (0, None), rules[rule]["slurm_partition"]) for rule in
                ("train_retriever", "encode_corpus", "ingest_corpus", "evaluate")}

    assert partitions() == {(True, "gpu-site"), (False, "cpu-site")}
    assert partitions("--configfile", str(tmp_path / "cli.yaml")) == {(True, "gpu-site"), (False, "cpu-cli")}


# ------------------------------------------------------------------------------------ the preflight names it
def test_each_fix_of_a_cluster_key_names_the_site_file_or_how_to_make_one(workdir):
    facts = read_cluster_facts(slurm(ANSWERS), user="alice")
    config = {"cluster": {"account": "physics", "gpus_per_node": 8}}
    jobs = [JobRequest("dense_search", "msmarco", 1, 8, 64000, 800, "gpu", "physics"),
            JobRequest("evaluate", "msmarco", 0, 1, 4000, 60, "cpu-a", "physics")]
    assert refusals(jobs, config, facts) == [
        "cluster.account is 'physics', which is not an account of user alice (sacctmgr: ir-lab); fix: set "
        "cluster.account in site.yaml (none yet: `make site` writes one) to one of them",
        "cluster.gpus_per_node is 8 but the nodes of partition gpu have at most 4 GPUs (sinfo); fix: set "
        "cluster.gpus_per_node: 4 in site.yaml (none yet: `make site` writes one)",
        "rule dense_search (dataset msmarco): asks 800 min; partition gpu allows 720 (sinfo %l); fix: set "
        "cluster.max_runtime: 720 in site.yaml (none yet: `make site` writes one)",
        "rule evaluate (dataset msmarco): partition cpu-a does not exist here (sinfo: cpu, debug, gpu); fix: set "
        "cluster.cpu_partition in site.yaml (none yet: `make site` writes one) to one of them"]
    (workdir / "site.yaml").write_text("cluster: {account: physics}\n")
    assert [line.split("fix: ")[1] for line in refusals(jobs, config, facts)] == [
        "set cluster.account in site.yaml to one of them", "set cluster.gpus_per_node: 4 in site.yaml",
        "set cluster.max_runtime: 720 in site.yaml", "set cluster.cpu_partition in site.yaml to one of them"]

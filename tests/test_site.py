"""The site file (orchestration/cluster_site.py): the cluster block read by every run without --configfile, the
command line winning over it, the preflight's fixes naming it; and `make site`'s proposal of one
(orchestration/site_probe.py) from a typical cluster's own words (sinfo, scontrol, sacctmgr output)."""

import copy
import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import REPO
from snakemake.utils import update_config

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.orchestration.cluster_facts import read_cluster_facts
from dpr_pipeline.orchestration.cluster_site import SITE_ENV, read_site, site_file, site_label, site_overrides
from dpr_pipeline.orchestration.config import validate_config
from dpr_pipeline.orchestration.preflight import JobRequest, refusals
from dpr_pipeline.orchestration.site_probe import probe_site, propose, site_text, write_site

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
    "sacctmgr -nP show assoc": "ir-lab|80|normal|normal,gpu-short\n",     # account,maxsubmit,defaultqos,qos
    "sacctmgr -nP show qos": "normal||||\ngpu-short||1-00:00:00||\ngpu-long||3-00:00:00||\n",   # name,MaxSubmitPU,
    #                                                                            MaxWall,MaxTRESPU,MaxTRES
    "scontrol show config": "AccountingStorageEnforce = associations,limits,qos\nClusterName = uni\n",
    "scontrol -o show partition": SCONTROL_PARTITIONS,
}
CONFIG = yaml.safe_load((REPO / "config.yaml").read_text())


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


def written(found, path) -> dict:
    """``found`` written as the site file ``path``, read back through the run's own reader."""
    write_site(path, site_text(found, header="a proposal"))
    return read_site(path)


# ------------------------------------------------------------------------------------------------ make site
def test_the_typical_cluster_gives_a_site_file_that_validates_and_round_trips(tmp_path):
    found = probe_site(slurm(ANSWERS), user="alice")
    site = written(found, tmp_path / "site.yaml")
    assert site == {"cluster": {"gpu_partition": "gpu", "cpu_partition": "cpu", "gpus_per_node": 4,
                                "gpu_model": "a100", "account": "ir-lab", "qos": "gpu-short",
                                "max_runtime": 720}}
    assert site["cluster"] == {key: proposal.value for key, proposal in found.items() if proposal.proposed}
    config = copy.deepcopy(CONFIG)
    update_config(config, site)                                     # as the run merges it: a valid whole
    validate_config(config)
    text = (tmp_path / "site.yaml").read_text()
    assert ("  gpu_partition: gpu   # sinfo -N: the partition with GPU nodes (%G); also with GPUs: debug (2 a "
            "node)") in text
    assert "  max_runtime: 720   # sinfo: partition gpu's time limit (%l)" in text
    assert "  account: ir-lab   # sacctmgr show assoc user=alice: your one account" in text
    assert ("  qos: gpu-short   # scontrol show partition gpu: AllowQos=gpu-short,gpu-long; sacctmgr show assoc: "
            "yours gpu-short, normal") in text
    assert "  # gpu_constraint: null" in text and "  # gpu_request: gpus" in text    # nothing said: left out


def test_what_the_answers_leave_open_stays_commented_out_saying_why(tmp_path):
    answers = {**ANSWERS,
               "sinfo -h -N": SINFO_NODES.replace("gpu:a100:4(S:0-1)\ngpu|g002", "gpu:v100:4\ngpu|g002"),
               "sacctmgr -nP show assoc": "ir-lab|||gpu-short,gpu-long\nphysics|||\n",
               "sacctmgr -nP show qos": "gpu-short||04:00:00||\ngpu-long||3-00:00:00||\n"}
    found = probe_site(slurm(answers), user="alice")
    assert written(found, tmp_path / "site.yaml")["cluster"] == {"gpu_partition": "gpu", "cpu_partition": "cpu",
                                                                 "gpus_per_node": 4, "max_runtime": 720}
    text = (tmp_path / "site.yaml").read_text()
    assert ("  # account: null   # sacctmgr show assoc user=alice: your accounts are ir-lab, physics: set one (null: "
            "your default)") in text
    assert "  # gpu_model: null   # sinfo -N: several GPU types (a100, v100): name one to ask for it" in text
    assert "  # qos: null   # scontrol show partition gpu: AllowQos=gpu-short,gpu-long; sacctmgr show assoc: yours " \
           "gpu-long, gpu-short: set one of gpu-long, gpu-short" in text


def test_a_qos_shorter_than_the_partition_caps_the_runtime_and_an_open_partition_needs_none():
    facts = read_cluster_facts(slurm({**ANSWERS, "sacctmgr -nP show assoc": "ir-lab|80|gpu-short|gpu-short\n",
                                      "sacctmgr -nP show qos": "gpu-short||04:00:00||\n"}), user="alice")
    short = propose(facts, SCONTROL_PARTITIONS)
    assert (short["qos"].value, short["max_runtime"].value) == ("gpu-short", 240)
    assert short["max_runtime"].source.startswith("sacctmgr show qos gpu-short: MaxWall, below sinfo")
    open_partition = propose(facts, SCONTROL_PARTITIONS.replace("AllowQos=gpu-short,gpu-long", "AllowQos=ALL"))
    assert not open_partition["qos"].proposed and open_partition["max_runtime"].value == 240   # the default QoS's
    assert "AllowQos=ALL" in open_partition["qos"].source
    answers = {key: text for key, text in ANSWERS.items() if not key.startswith("sacctmgr")}   # it did not answer
    untyped = read_cluster_facts(slurm({**answers, "sinfo -h -N": "cpu|c001|8|16000|(null)\ngpu|g1|8|64000|gpu:2\n",
                                        "sinfo -h": "cpu*|1:00:00|up\ngpu|infinite|up\n"}), user="alice")
    found = propose(untyped, None)                                # nor scontrol
    assert not found["gpu_model"].proposed and "untyped GRES" in found["gpu_model"].source
    assert not found["max_runtime"].proposed and "INFINITE" in found["max_runtime"].source
    assert not found["qos"].proposed and found["gpus_per_node"].value == 2


def test_without_gpu_nodes_the_gpu_keys_are_left_to_the_user():
    cpus_only = read_cluster_facts(slurm({**ANSWERS, "sinfo -h -N": "cpu|c001|64|256000|(null)\n",
                                          "sinfo -h": "cpu*|2-00:00:00|up\n"}), user="alice")
    found = propose(cpus_only, SCONTROL_PARTITIONS)
    assert not found["gpu_partition"].proposed and "no partition has nodes with GPUs" in found["gpu_partition"].source
    assert set(found) == {"gpu_partition", "cpu_partition", "account"}


def test_without_slurm_the_template_holds_every_cluster_key_commented_out_with_its_description(tmp_path):
    assert probe_site(slurm({}), user="alice") is None                       # no sinfo
    assert written(None, tmp_path / "site.yaml") == {"cluster": {}}
    text = (tmp_path / "site.yaml").read_text()
    schema = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())["properties"]["cluster"]
    comments = [line.removeprefix("  # ") for line in text.splitlines() if line.startswith("  # ")]
    for key, spec in schema["properties"].items():                  # its default, under its description
        assert [yaml.safe_load(line) for line in comments if line.startswith(f"{key}: ")] == [{key: spec["default"]}]
        assert " ".join(spec["description"].split()) in " ".join(comments)
    # uncommenting a key gives a valid site file
    (tmp_path / "site.yaml").write_text(text.replace("  # gpu_partition: null", "  gpu_partition: gpu"))
    assert read_site(tmp_path / "site.yaml") == {"cluster": {"gpu_partition": "gpu"}}


def test_an_existing_site_file_is_never_replaced(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("cluster: {account: mine}\n")
    assert write_site(site, site_text(None)) == tmp_path / "site.proposed.yaml"
    assert site.read_text() == "cluster: {account: mine}\n"
    assert read_site(tmp_path / "site.proposed.yaml") == {"cluster": {}}


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

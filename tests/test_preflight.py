"""The preflight (orchestration/preflight.py) on a typical university GPU cluster's own words (sinfo, sacctmgr, scontrol
output), and the cluster resources the rules ask for (orchestration/resources.py)."""

import subprocess

import pytest
import yaml
from conftest import REPO

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.orchestration import stage_settings
from dpr_pipeline.orchestration.cluster_facts import (Association, Qos, gpus_of, parse_associations, parse_qos,
                                                      parse_tres, read_cluster_facts, slurm_minutes, takes_jobs)
from dpr_pipeline.orchestration.cluster_site import site_label
from dpr_pipeline.orchestration.config import validate_config
from dpr_pipeline.orchestration.preflight import JobRequest, RetryCaps, check_plan, job_request, refusals, retry_caps
from dpr_pipeline.orchestration.resources import (cluster_resources, gpu_request, job_resources, job_runtime,
                                                  nodes_of, processes_for, scaled, training_request)

# A typical site: a CPU partition (2 days), a GPU partition of 4-GPU nodes with a 12 h limit, a short debug one.
SINFO_PARTITIONS = "cpu*|2-00:00:00|up\ngpu|12:00:00|up\ndebug|30:00|up\n"
SINFO_NODES = ("cpu|c001|64|256000|(null)\ncpu|c002|64|256000|(null)\n"
               "gpu|g001|64|512000|gpu:a100:4(S:0-1)\ngpu|g002|64|512000|gpu:a100:4(S:0-1)\n"
               "debug|g003|32|128000|gpu:2\n")
# sacctmgr -nP show assoc user=alice format=account,maxsubmit,defaultqos,qos; sacctmgr -nP show qos format=name,
# maxsubmitjobsperuser,maxwall,maxtresperuser,maxtres: the default QoS `normal`, without limits of its own
SACCTMGR = "ir-lab|80|normal|normal\n"
SACCTMGR_QOS = "normal||||\n"
SCONTROL_CONFIG = "AccountingStorageEnforce = associations,limits,qos\nClusterName = uni\n"

CONFIG = validate_config(yaml.safe_load((REPO / "config.yaml").read_text()))


def fake_slurm(outputs):
    """A subprocess.run answering each command (its first words) with canned output (None: it fails); others: not
    found."""
    def run(command, **_):
        for prefix, text in outputs.items():
            if command[:len(prefix.split())] == prefix.split():
                return subprocess.CompletedProcess(command, 0 if text is not None else 1, text or "", "")
        raise FileNotFoundError(command[0])
    return run


TYPICAL_OUTPUTS = {"sinfo -h -N": SINFO_NODES, "sinfo -h": SINFO_PARTITIONS, "sacctmgr -nP show assoc": SACCTMGR,
                   "sacctmgr -nP show qos": SACCTMGR_QOS, "scontrol show": SCONTROL_CONFIG}
TYPICAL = fake_slurm(TYPICAL_OUTPUTS)
# A stricter site: the same cluster, its default QoS allowing 20 jobs submitted per user, 8 h a job and 4 GPUs per
# user; a `long` QoS allowing 2 days and 8 GPUs.
STRICT_QOS = ("normal|20|08:00:00|gres/gpu=4|\n"
              "long|10|2-00:00:00|cpu=128,gres/gpu=8,mem=1000G|gres/gpu=8\n")
STRICT = fake_slurm({**TYPICAL_OUTPUTS, "sacctmgr -nP show assoc": "ir-lab|80|normal|long,normal\n",
                     "sacctmgr -nP show qos": STRICT_QOS})


def with_cluster(**cluster):
    return {**CONFIG, "cluster": {**CONFIG["cluster"], **cluster}}


def msmarco_training_jobs(config) -> list[JobRequest]:
    """The msmarco chain's training jobs as the rules ask for them (rules/common.smk resources_of)."""
    jobs = []
    for rule, block in (("pretrain", "pretrain"), ("train_retriever", "retriever"), ("train_reranker", "reranker"),
                        ("train_distill", "distill")):
        first = job_resources(config, "msmarco", rule)
        resources = {**training_request(config, stage_settings.training_processes(config, "msmarco", block),
                                        stage_settings.training_nodes(config, "msmarco", block)),
                     **cluster_resources(config, gpu_rule=True), "mem_mb": first["mem_mb"],
                     "runtime": job_runtime(config, first["runtime"], 1)}
        jobs.append(job_request(rule, {"dataset": "msmarco"}, resources, first["threads"]))
    return jobs


def with_stages(config, dataset, **blocks):
    """``config`` with ``datasets.<dataset>.stages.<block>`` updated by each of ``blocks``' settings."""
    stages = {**config["datasets"][dataset]["stages"]}
    for block, values in blocks.items():
        stages[block] = {**stages.get(block, {}), **values}
    return {**config, "datasets": {**config["datasets"], dataset: {**config["datasets"][dataset], "stages": stages}}}


@pytest.mark.parametrize("text, minutes", [("infinite", None), ("UNLIMITED", None), ("30", 30), ("30:00", 30),
                                           ("30:01", 31), ("2:00:00", 120), ("1-00:00:00", 1440), ("2-12", 3600),
                                           ("1-02:30", 1590), ("7-00:00:00", 10080)])
def test_slurm_times_in_minutes(text, minutes):
    assert slurm_minutes(text) == minutes


def test_gpus_of_a_nodes_gres():
    assert gpus_of("(null)") == (0, ())
    assert gpus_of("gpu:4") == (4, ())
    assert gpus_of("gpu:a100:4(S:0-1)") == (4, ("a100",))
    assert gpus_of("gpu:a100:2,gpu:v100:2,shard:8") == (4, ("a100", "v100"))


def test_the_typical_clusters_facts():
    facts = read_cluster_facts(TYPICAL, user="alice")
    assert facts.default_partition == "cpu" and set(facts.partitions) == {"cpu", "gpu", "debug"}
    gpu = facts.partitions["gpu"]
    assert gpu.max_minutes == 720 and gpu.most("gpus") == 4 and gpu.most("mem_mb") == 512000
    assert facts.partitions["debug"].max_minutes == 30 and facts.partitions["cpu"].most("gpus") == 0
    assert facts.accounts == {"ir-lab"} and facts.accounts_enforced is True
    assert read_cluster_facts(fake_slurm({}), user="alice") is None              # no sinfo: not a Slurm host


def test_the_msmarco_plan_on_4_gpu_nodes_is_refused_with_the_settings_that_fix_it():
    """8-GPU pre-training and re-ranker on 4-GPU nodes, 24 h pre-training with no cap under a 12 h limit: refused
    before anything is submitted, one message per kind of job, each naming the setting; fixed, nothing is refused."""
    facts = read_cluster_facts(TYPICAL, user="alice")
    config = with_cluster(gpu_partition="gpu", max_runtime=None, account="ir-lab")
    found = refusals(msmarco_training_jobs(config), config, facts)
    gpus = [message for message in found if "GPUs on one node" in message]
    assert len(gpus) == 2                                                        # pretrain and train_reranker
    # the partition has two 4-GPU nodes: the same 8 processes over 2 nodes
    assert any("rule pretrain (dataset msmarco): asks 8 GPUs on one node; a node of the GPU partition has 4; "
               "fix: set datasets.msmarco.stages.pretrain.nodes: 2 (4 GPUs on each of 2 nodes: the same 8 processes "
               "and global batch)" in message for message in gpus)
    assert any("datasets.msmarco.stages.reranker.nodes: 2" in message for message in gpus)
    runtime = [message for message in found if "min; partition gpu allows 720" in message]
    assert runtime and all(f"fix: set cluster.max_runtime: 720 in {site_label()} (a training longer than that "
                           "continues from its checkpoint" in message for message in runtime)
    from dpr_pipeline.orchestration.preflight import planned_requests

    search = PlannedJob("dense_search", runtime=800, dataset="msmarco", stage="retriever1")
    assert refusals(planned_requests([search], set()), config, facts) == [      # not a training: nothing continues
        "rule dense_search (dataset msmarco): asks 800 min; partition gpu allows 720 (sinfo %l); fix: set "
        f"cluster.max_runtime: 720 in {site_label()}"]
    with pytest.raises(ConfigError, match="nothing was submitted"):
        check_plan(msmarco_training_jobs(config), config, facts)

    fixed = with_stages(with_cluster(gpu_partition="gpu", account="ir-lab", max_runtime=720), "msmarco",
                        pretrain={"nodes": 2}, reranker={"nodes": 2})
    assert refusals(msmarco_training_jobs(fixed), fixed, facts) == []
    pretrain = msmarco_training_jobs(fixed)[0]
    assert (pretrain.gpus, pretrain.nodes, pretrain.threads) == (4, 2, 32)      # per node: 4 GPUs, 32 CPUs


def test_a_stage_over_nodes_is_refused_only_where_a_node_cannot_hold_its_share():
    """2-GPU nodes: 8 processes over 2 nodes ask 4 on each, refused, naming the 4 nodes that hold the same 8
    processes; over 4 nodes nothing is refused. Where the partition has too few such nodes (one 4-GPU node), the
    fix stays fewer processes."""
    config = with_stages(with_cluster(gpus_per_node=2), "msmarco", pretrain={"nodes": 2})
    found = refusals(msmarco_training_jobs(config)[:1], config, None)
    assert found == ["rule pretrain (dataset msmarco): asks 4 GPUs on each of 2 nodes; a node of the GPU partition "
                     "has 2; fix: set datasets.msmarco.stages.pretrain.nodes: 4 (2 GPUs on each of 4 nodes: the same "
                     f"8 processes and global batch), or a partition with 4-GPU nodes (cluster.gpu_partition in "
                     f"{site_label()})"]
    spread = with_stages(config, "msmarco", pretrain={"nodes": 4})
    assert refusals(msmarco_training_jobs(spread)[:1], spread, None) == []
    one_node = read_cluster_facts(fake_slurm({"sinfo -h -N": "gpu|g001|64|512000|gpu:4\n",
                                              "sinfo -h": "gpu|12:00:00|up\n"}), user="alice")
    config = with_cluster(gpu_partition="gpu")
    found = refusals(msmarco_training_jobs(config)[:1], config, one_node)
    assert any("asks 8 GPUs on one node; a node of the GPU partition has 4; fix: set "
               "datasets.msmarco.stages.pretrain.processes: 4" in message for message in found), found


def test_partitions_accounts_and_node_sizes_are_checked():
    facts = read_cluster_facts(TYPICAL, user="alice")
    config = with_cluster(account="physics")
    job = JobRequest("encode_corpus", "msmarco", 1, 8, 64000, 120, "gpu-a100", "physics")
    found = refusals([job, job], config, facts)
    assert found[0].startswith("cluster.account is 'physics', which is not an account of user alice "
                               "(sacctmgr: ir-lab)")
    assert found[1] == ("rule encode_corpus (dataset msmarco): partition gpu-a100 does not exist here (sinfo: cpu, "
                        f"debug, gpu); fix: set cluster.gpu_partition in {site_label()} to one of them [2 jobs]")
    no_gpus = JobRequest("encode_corpus", "msmarco", 1, 8, 64000, 120, None, None)     # default partition: cpu
    assert "has no node with GPUs" in refusals([no_gpus], CONFIG, facts)[0]
    big = JobRequest("passage_store", "msmarco", 0, 128, 1024000, 60, "cpu", None)
    found = refusals([big], CONFIG, facts)
    assert any("asks 1024000 MB of memory; the largest node of partition cpu has 256000; fix: "
               "datasets.msmarco.resources.passage_store.mem_mb at most 256000" in message for message in found)
    assert any("asks 128 CPUs" in message for message in found)
    short = JobRequest("evaluate", "scifact", 0, 1, 4000, 60, "debug", None)
    assert "partition debug allows 30" in refusals([short], CONFIG, facts)[0]


def test_without_sinfo_the_configs_own_limits_are_checked():
    config = with_cluster(gpus_per_node=4)
    found = refusals(msmarco_training_jobs(config), config, None)
    assert len(found) == 2 and all("a node of the GPU partition has 4" in message for message in found)
    assert refusals(msmarco_training_jobs(CONFIG), CONFIG, None) == []              # nothing known: nothing refused
    facts = read_cluster_facts(TYPICAL, user="alice")
    wrong = with_cluster(gpus_per_node=8, gpu_partition="gpu")
    assert any("cluster.gpus_per_node is 8 but the nodes of partition gpu have at most 4" in message
               for message in refusals(msmarco_training_jobs(wrong), wrong, facts))


def test_more_jobs_at_once_than_the_user_may_submit():
    facts = read_cluster_facts(TYPICAL, user="alice")
    assert facts.associations == (Association("ir-lab", 80, "normal", ("normal",)),)
    assert refusals([], CONFIG, facts, jobs_at_once=80) == []
    assert refusals([], CONFIG, facts, jobs_at_once=100) == [
        "Snakemake may queue 100 jobs at once (--jobs, the profile's `jobs:`) but user alice may submit 80 "
        "(sacctmgr MaxSubmitJobs); fix: --jobs 80 (or `jobs: 80` in your copy of the profile)"]
    both = refusals([], with_cluster(account="physics"), facts, jobs_at_once=100)   # no limit known for physics
    assert len(both) == 1 and both[0].startswith("cluster.account is 'physics'")


def test_a_user_without_an_account_where_one_is_required():
    facts = read_cluster_facts(fake_slurm({**TYPICAL_OUTPUTS, "sacctmgr -nP show assoc": ""}), user="bob")
    assert refusals([], CONFIG, facts) == [
        "user bob has no Slurm account and this cluster requires one (AccountingStorageEnforce=associations); fix: "
        f"ask the cluster's administrators for one, then set cluster.account in {site_label()}"]


def test_the_rules_cluster_resources_follow_the_config():
    assert cluster_resources(CONFIG, gpu_rule=True) == {}                            # defaults: the cluster's own
    config = with_cluster(cpu_partition="cpu", gpu_partition="gpu", account="ir-lab", qos="normal",
                          gpu_constraint="a100|h100")
    assert cluster_resources(config, gpu_rule=False) == {"slurm_partition": "cpu", "slurm_account": "ir-lab",
                                                         "qos": "normal"}
    assert cluster_resources(config, gpu_rule=True) == {"slurm_partition": "gpu", "slurm_account": "ir-lab",
                                                        "qos": "normal", "constraint": "a100|h100"}
    assert gpu_request(CONFIG, 4) == {"gpu": 4}
    assert gpu_request(with_cluster(gpu_model="a100"), 4) == {"gpu": 4, "gpu_model": "a100"}
    assert gpu_request(with_cluster(gpu_request="gres"), 4) == {"gres": "gpu:4"}
    assert gpu_request(with_cluster(gpu_request="gres", gpu_model="a100"), 2) == {"gres": "gpu:a100:2"}
    assert CONFIG["cluster"]["max_runtime"] == 1440                                  # a 24 h cap by default


class PluginJob:
    """What snakemake-executor-plugin-slurm reads of a job to build its sbatch line: resources, threads."""

    class Resources(dict):
        __getattr__ = dict.__getitem__

    def __init__(self, resources: dict, threads: int):
        self.resources, self.threads = self.Resources(resources), threads


def sbatch_line(resources: dict, threads: int) -> str:
    """The plugin's sbatch command for a job of ``resources`` (its own functions, as it submits)."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    job = PluginJob(resources, threads)
    params = {"run_uuid": "run", "slurm_logfile": "log", "comment_str": "rule", "account": "", "partition": "",
              "workdir": None}
    return get_submit_command(job, params) + set_gres_string(job)


def test_a_training_over_nodes_asks_each_node_for_its_share_of_the_gpus():
    """8 processes over 4 nodes: sbatch --nodes=4 --ntasks=4 (one task per node, its threads as --cpus-per-task) and
    --gres=gpu:2, counted per node (--gpus=8 would let Slurm place them unevenly), whatever cluster.gpu_request; no
    --ntasks-per-gpu. `mpi` makes the plugin's job step run the job's process on the first node without a one-task
    srun around it, so that the training starts its own srun over the nodes. One node asks as before."""
    over_nodes = training_request(CONFIG, 8, 4)
    assert over_nodes == {"gres": "gpu:2", "nodes": 4, "tasks": 4, "tasks_per_gpu": 0, "mpi": "srun"}
    assert processes_for(over_nodes) == 8 and nodes_of(over_nodes) == 4
    assert training_request(with_cluster(gpu_model="h100"), 8, 4)["gres"] == "gpu:h100:2"
    line = sbatch_line({**over_nodes, "mem_mb": 64000, "runtime": 600}, threads=16)
    assert {"--nodes=4", "--ntasks=4", "--gres=gpu:2", "--cpus-per-task=16"} <= set(line.split()), line
    assert "--gpus" not in line and "--ntasks-per-gpu" not in line, line
    one_node = training_request(CONFIG, 8, 1)
    assert one_node == {"gpu": 8, "nodes": 1} and "mpi" not in one_node and processes_for(one_node) == 8
    line = sbatch_line({**one_node, "mem_mb": 64000, "runtime": 600}, threads=16)
    assert {"--nodes=1", "--gpus=8", "--cpus-per-task=16"} <= set(line.split()) and "--ntasks" not in line, line


class PlannedJob:
    """What planned_requests reads of a Snakemake job: its rule (name, norun), wildcards, resources, threads."""

    def __init__(self, rule: str, threads: int = 8, mem_mb: int = 32000, runtime: int = 30, **wildcards):
        self.rule = type("Rule", (), {"name": rule, "norun": False})()
        self.wildcards_dict, self.threads = wildcards, threads
        self.resources = {"gpu": 1, "mem_mb": mem_mb, "runtime": runtime, "slurm_partition": "gpu"}


def test_shard_jobs_go_in_groups_run_one_after_the_other_and_a_group_too_long_is_refused_with_its_size():
    """Snakemake's `--group-components encode_corpus_{dataset}_{stage}=8` under `--resources shard_gpu=1`: a stage's 20
    encoding shards are 3 submissions (8, 8, 4 shards) asking the shards' summed runtime and their largest memory;
    pieces of work (stages) never share one. On the typical cluster's 12 h GPU partition a group of 8 two-hour
    shards is refused, naming the size that fits."""
    from dpr_pipeline.orchestration.preflight import check_shard_groups, planned_requests

    jobs = [PlannedJob("encode_corpus", dataset="msmarco", stage=stage, shard=str(shard))
            for stage in ("retriever1", "retriever2") for shard in range(20)]
    jobs += [PlannedJob("train_retriever", runtime=480, dataset="msmarco", stage="retriever1")]
    sizes = {"encode_corpus_{dataset}_{stage}": 8}
    requests = planned_requests(jobs, local_rules=set(), group_sizes=sizes)
    encode = [request for request in requests if request.rule == "encode_corpus"]
    assert sorted(request.shards for request in encode) == [4, 4, 8, 8, 8, 8]
    assert {(request.shards, request.runtime, request.mem_mb, request.gpus) for request in encode} == {
        (8, 240, 32000, 1), (4, 120, 32000, 1)}
    assert len(planned_requests(jobs, local_rules=set())) == 41                # no groups: one submission each
    facts = read_cluster_facts(TYPICAL, user="alice")
    long = [PlannedJob("encode_corpus", runtime=120, dataset="msmarco", stage="retriever1", shard=str(shard))
            for shard in range(8)]
    found = refusals(planned_requests(long, set(), sizes), CONFIG, facts)
    assert found == ["rule encode_corpus (dataset msmarco): asks 960 min for 8 shard jobs run one after the other; "
                     "partition gpu allows 720 (sinfo %l); fix: group-components "
                     "encode_corpus_{dataset}_{stage}=6 (snakemake's --group-components, or in your copy of the "
                     "profile)"]
    check_shard_groups(sizes, 1)
    with pytest.raises(ConfigError, match=r"--resources shard_gpu is None, not 1.*add `resources: \[shard_gpu=1\]`"):
        check_shard_groups(sizes, None)
    check_shard_groups({"encode_corpus_{dataset}_{stage}": 1}, None)          # no group: nothing to limit


def test_the_slurm_profile_groups_every_shard_rule_under_its_workflow_name():
    from dpr_pipeline import stages

    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    groups = dict(item.rsplit("=", 1) for item in profile["group-components"])
    assert set(groups) == {stages.shard_group(rule) for rule in stages.SHARD_GROUPS}
    assert profile["resources"] == ["shard_gpu=1"]


# --- QoS limits (sacctmgr show qos) -------------------------------------------------------------------------------

def test_sacctmgr_associations_qos_and_tres_are_parsed_from_its_own_lines():
    assert parse_associations("ir-lab|80|normal|long,normal\nphysics||||\n") == (
        Association("ir-lab", 80, "normal", ("long", "normal")), Association("physics", None, None, ()))
    assert parse_tres("cpu=128,gres/gpu=8,mem=1000G") == {"cpu": 128, "gres/gpu": 8}    # memory has a unit: left out
    assert parse_tres("gres/gpu:a100=2") == {"gres/gpu:a100": 2} and parse_tres("") == {}
    assert parse_qos(STRICT_QOS) == {
        "normal": Qos("normal", 20, 480, {"gres/gpu": 4}, {}),
        "long": Qos("long", 10, 2880, {"cpu": 128, "gres/gpu": 8}, {"gres/gpu": 8})}
    assert parse_qos("normal||||\n") == {"normal": Qos("normal")}                         # empty fields: no limit


def test_the_qos_a_job_runs_under_is_the_default_else_the_only_one():
    assert Association("ir-lab", qos=("long", "normal"), default_qos="long").job_qos() == "long"
    assert Association("ir-lab", qos=("normal",)).job_qos() == "normal"
    assert Association("ir-lab", qos=("long", "normal")).job_qos() is None     # Slurm's root default or `normal`


def test_the_default_qos_limits_submissions_runtime_and_gpus_of_cpu_and_gpu_jobs():
    """The strict site's default QoS: 20 jobs submitted per user (the profile queues 50), 8 h a job (CPU jobs too),
    4 GPUs per user: each refused before the first sbatch, naming the QoS, sacctmgr's field and the fix."""
    facts = read_cluster_facts(STRICT, user="alice")
    config = with_cluster(gpu_partition="gpu", cpu_partition="cpu", max_runtime=None)
    store = JobRequest("passage_store", "msmarco", 0, 8, 64000, 600, "cpu", None)
    reranker = JobRequest("train_reranker", "msmarco", 8, 32, 256000, 480, "gpu", None)
    debug = JobRequest("train_retriever", "scifact", 2, 8, 4000, 20, "debug", None)   # typeless GPUs, no type asked
    assert refusals([store, reranker, debug], config, facts, jobs_at_once=50) == [
        "Snakemake may queue 50 jobs at once (--jobs, the profile's `jobs:`) but user alice may submit 20 (sacctmgr "
        "QoS normal MaxSubmitPU); fix: --jobs 20 (or `jobs: 20` in your copy of the profile)",
        "rule passage_store (dataset msmarco): asks 600 min; QoS normal allows 480 (sacctmgr MaxWall); fix: set "
        f"cluster.max_runtime: 480 in {site_label()}",
        "rule train_reranker (dataset msmarco): asks 8 GPUs on one node; a node of the GPU partition has 4; fix: set "
        "datasets.msmarco.stages.reranker.nodes: 2 (4 GPUs on each of 2 nodes: the same 8 processes and global "
        f"batch), or a partition with 8-GPU nodes (cluster.gpu_partition in {site_label()})",
        "rule train_reranker (dataset msmarco): asks 8 GPUs; QoS normal allows 4 (sacctmgr MaxTRESPU gres/gpu=4); "
        "fix: set datasets.msmarco.stages.reranker.processes: 4 (the global batch stays the same; micro_batch_size "
        f"bounds each GPU's memory), or a QoS that allows 8 (cluster.qos in {site_label()})"]
    long = with_cluster(gpu_partition="gpu", cpu_partition="cpu", max_runtime=None, qos="long")
    assert refusals([store, reranker, debug], long, facts, jobs_at_once=10) == [      # cluster.qos: its limits
        "rule train_reranker (dataset msmarco): asks 8 GPUs on one node; a node of the GPU partition has 4; fix: set "
        "datasets.msmarco.stages.reranker.nodes: 2 (4 GPUs on each of 2 nodes: the same 8 processes and global "
        f"batch), or a partition with 8-GPU nodes (cluster.gpu_partition in {site_label()})"]
    assert refusals([store], long, facts, jobs_at_once=11)[0].endswith("may submit 10 (sacctmgr QoS long "
                                                                        "MaxSubmitPU); fix: --jobs 10 (or `jobs: 10` "
                                                                        "in your copy of the profile)")


def test_a_qos_the_cluster_lacks_is_refused_and_an_unknown_qos_leaves_its_limits_unchecked():
    facts = read_cluster_facts(STRICT, user="alice")
    assert refusals([], with_cluster(qos="gpu-long"), facts) == [
        "cluster.qos is 'gpu-long', which is not a QoS of this cluster (sacctmgr show qos: long, normal); fix: set "
        f"cluster.qos in {site_label()} to one of them, or null"]
    store = JobRequest("passage_store", "msmarco", 0, 8, 64000, 600, "cpu", None)
    no_qos = read_cluster_facts(fake_slurm({**TYPICAL_OUTPUTS, "sacctmgr -nP show assoc": "ir-lab|80|normal|normal\n",
                                            "sacctmgr -nP show qos": None}), user="alice")
    assert no_qos.qos is None and refusals([store], CONFIG, no_qos, jobs_at_once=50) == []   # sacctmgr failed
    several = read_cluster_facts(fake_slurm({**TYPICAL_OUTPUTS, "sacctmgr -nP show assoc": "ir-lab|80||long,normal\n",
                                             "sacctmgr -nP show qos": STRICT_QOS}), user="alice")
    assert refusals([store], CONFIG, several, jobs_at_once=50) == []        # no default QoS: which applies is unknown


# --- typed GPUs (cluster.gpu_model) -------------------------------------------------------------------------------

def test_a_gpu_type_the_partitions_nodes_lack_is_refused_naming_the_types_they_have():
    facts = read_cluster_facts(TYPICAL, user="alice")
    encode = JobRequest("encode_corpus", "msmarco", 1, 8, 32000, 60, "gpu", None)
    assert refusals([encode], with_cluster(gpu_model="a100"), facts) == []
    assert refusals([encode], with_cluster(gpu_model="v100"), facts) == [
        "rule encode_corpus (dataset msmarco): asks GPUs of type v100 (cluster.gpu_model); the nodes of partition "
        f"gpu have GPUs of type a100 (sinfo %G); fix: set cluster.gpu_model in {site_label()} to one of them, or null"]
    on_debug = JobRequest("encode_corpus", "msmarco", 1, 8, 32000, 20, "debug", None)
    assert refusals([on_debug], with_cluster(gpu_model="a100"), facts) == [
        "rule encode_corpus (dataset msmarco): asks GPUs of type a100 (cluster.gpu_model); the nodes of partition "
        "debug have GPUs without a type (sinfo %G: gpu:N), which no typed request gets; fix: set "
        f"cluster.gpu_model: null in {site_label()}"]
    cpu_job = JobRequest("passage_store", "msmarco", 0, 8, 32000, 20, "debug", None)
    assert refusals([cpu_job], with_cluster(gpu_model="a100"), facts) == []          # CPU jobs ask no type


def test_a_typed_request_sees_only_the_nodes_of_its_type():
    """A partition of 8 untyped-GPU nodes and 4-GPU a100 nodes: an a100 job gets at most 4 GPUs."""
    mixed = fake_slurm({**TYPICAL_OUTPUTS, "sinfo -h": "gpu*|12:00:00|up\n",
                        "sinfo -h -N": "gpu|g001|64|512000|gpu:8\ngpu|g002|64|256000|gpu:a100:4(S:0-1)\n"})
    facts = read_cluster_facts(mixed, user="alice")
    encode = JobRequest("encode_corpus", "msmarco", 8, 8, 32000, 60, "gpu", None)
    assert refusals([encode], CONFIG, facts) == []
    assert refusals([encode], with_cluster(gpu_model="a100"), facts) == [
        "rule encode_corpus (dataset msmarco): asks 8 GPUs on one node; a node of the GPU partition has 4; fix: a "
        f"partition with 8-GPU nodes (cluster.gpu_partition in {site_label()})"]
    assert retry_caps(with_cluster(gpu_model="a100", gpu_partition="gpu"), facts, "encode_corpus").mem_mb == 256000


# --- retries: grown at most to what the cluster allows ------------------------------------------------------------

def test_a_retry_grows_at_most_to_the_largest_node_and_the_time_limit_never_below_the_first_attempt():
    assert [scaled(256000, attempt, 512000) for attempt in (1, 2, 3)] == [256000, 512000, 512000]
    assert scaled(600000, 2, 512000) == 600000                           # the first attempt as asked (refused apart)
    assert [job_runtime(CONFIG, 600, attempt, 720) for attempt in (1, 2)] == [600, 720]
    assert job_runtime(CONFIG, 1000, 2, 1440) == 1440                   # cluster.max_runtime (1440) too


def test_retry_caps_come_from_the_partition_the_qos_and_the_shard_groups():
    """The GPU partition's largest node (512 GB) and 12 h, the CPU partition's (256 GB) and 2 days, the QoS's 8 h
    where it is smaller, a teacher-score group's 8 shards sharing the 12 h: 90 minutes each. A failed group of eight
    1-hour shards then asks 8 x 90 = 720 minutes, not -t 960."""
    config = with_cluster(gpu_partition="gpu", cpu_partition="cpu")
    facts = read_cluster_facts(TYPICAL, user="alice")
    groups = {"teacher_scores_shard_{dataset}": 8}
    assert retry_caps(config, facts, "train_reranker") == RetryCaps(512000, 720)
    assert retry_caps(config, facts, "passage_store") == RetryCaps(256000, 2880)
    assert retry_caps(config, facts, "fetch") == RetryCaps(256000, 2880)              # the fetch jobs: CPU jobs
    assert retry_caps(config, facts, "teacher_scores_shard", groups) == RetryCaps(512000, 90)
    assert sum(job_runtime(config, 60, 2, retry_caps(config, facts, "teacher_scores_shard", groups).runtime)
               for _ in range(8)) == 720
    strict = read_cluster_facts(STRICT, user="alice")
    assert retry_caps(config, strict, "train_reranker") == RetryCaps(512000, 480)     # QoS normal: MaxWall 8 h
    assert retry_caps(config, strict, "passage_store") == RetryCaps(256000, 480)
    assert retry_caps(config, None, "train_reranker") == RetryCaps()                  # no sinfo: nothing known


def test_the_last_attempt_a_job_can_make_is_checked_and_refused_where_no_node_holds_it():
    """A partition whose largest node (1 TB) has no GPUs and whose 8-GPU nodes have 256 GB: pre-training asking
    128 GB passes at its first attempt, but with 3 retries its last asks 4 x 128 GB = 512 GB (under the 1 TB cap)
    with its 8 GPUs, which no node holds: refused, naming the attempt and the fixes."""
    mixed = fake_slurm({**TYPICAL_OUTPUTS, "sinfo -h": "big*|1-00:00:00|up\n",
                        "sinfo -h -N": "big|b001|64|1024000|(null)\nbig|b002|64|256000|gpu:8\n"})
    facts = read_cluster_facts(mixed, user="alice")
    from dpr_pipeline.orchestration.preflight import planned_requests

    pretrain = PlannedJob("pretrain", threads=32, mem_mb=128000, runtime=600, dataset="msmarco", method="simlm")
    pretrain.resources.update(gpu=8, slurm_partition="big")
    assert refusals(planned_requests([pretrain], set()), CONFIG, facts) == []           # no retries
    assert refusals(planned_requests([pretrain], set(), retries={"pretrain": 1}), CONFIG, facts) == []   # 256 GB fits
    assert refusals(planned_requests([pretrain], set(), retries={"pretrain": 3}), CONFIG, facts) == [
        "rule pretrain (dataset msmarco), its attempt 4 after 3 failed: asks 8 GPUs, 32 CPUs and 512000 MB together, "
        "which no single node of partition big has; fix: datasets.msmarco.resources.pretrain.mem_mb or "
        "datasets.msmarco.resources.pretrain.threads, or fewer retries (--retries)"]


@pytest.mark.slow
def test_the_rules_resources_grow_on_retries_only_to_the_caps_of_the_facts_the_run_was_checked_against(
        tmp_path, monkeypatch):
    """Snakemake's own evaluation of the rules' resources per attempt (rules/common.smk resources_of): without the
    facts (a dry run, inside a job) a retry doubles and triples; with those onstart stores, the training's memory
    stops at the GPU partition's largest node (512 GB) and its runtime at 12 h, and an encoding shard's runtime at
    12 h / 8 (its group of 8)."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    monkeypatch.chdir(REPO)                                             # built_dag runs from the repository root
    from dag_plan import built_dag

    (tmp_path / "big.yaml").write_text(yaml.safe_dump({
        "cluster": {"gpu_partition": "gpu", "cpu_partition": "cpu"},
        "datasets": {"scifact": {"resources": {"train_retriever": {"mem_mb": 200000, "runtime": 300}}}}}))
    with built_dag(["results/scifact/retriever1/metrics.json"], [str(tmp_path / "big.yaml")]) as workflow:
        jobs = {job.rule.name: job for job in workflow.dag.jobs}

        def attempts(rule):
            job, asked = jobs[rule], []
            for attempt in (1, 2, 3):
                job.attempt = attempt
                asked.append((job.resources["mem_mb"], job.resources["runtime"]))
            return asked

        assert attempts("train_retriever") == [(200000, 300), (400000, 600), (600000, 900)]
        workflow.globals["SUBMITTED_TO"].update(facts=read_cluster_facts(TYPICAL, user="alice"),
                                                group_sizes={"encode_corpus_{dataset}_{stage}": 8})
        assert attempts("train_retriever") == [(200000, 300), (400000, 600), (512000, 720)]
        assert [runtime for _, runtime in attempts("encode_corpus")] == [60, 90, 90]


def test_offline_nodes_are_not_counted_and_a_partition_without_a_node_that_takes_jobs_is_refused():
    """sinfo %t: a down, drained or not responding node takes no job. The gpu partition's 8-GPU node is down, so
    8 GPUs on one node are refused as on 4-GPU nodes; with every GPU node offline, no GPU job can run at all."""
    assert [takes_jobs(state) for state in ("idle", "mix", "alloc", "idle~", "comp", "plnd")] == [True] * 6
    assert [takes_jobs(state) for state in ("down*", "down", "drain", "drng", "idle*", "fail", "maint", "futr",
                                            "resv", "unk*")] == [False] * 10
    nodes = SINFO_NODES.replace("\n", "|idle\n") + "gpu|g009|64|512000|gpu:a100:8|down*\n"
    facts = read_cluster_facts(fake_slurm({**TYPICAL_OUTPUTS, "sinfo -h -N": nodes}), user="alice")
    assert facts.partitions["gpu"].most("gpus") == 4 and facts.partitions["gpu"].offline == ("g009 (down*)",)
    eight = JobRequest("pretrain", "msmarco", 8, 32, 256000, 600, "gpu", None)
    assert any("asks 8 GPUs on one node; a node of the GPU partition has 4" in line
               for line in refusals([eight], CONFIG, facts))
    all_down = nodes.replace("gpu:a100:4(S:0-1)|idle", "gpu:a100:4(S:0-1)|drain")
    facts = read_cluster_facts(fake_slurm({**TYPICAL_OUTPUTS, "sinfo -h -N": all_down}), user="alice")
    four = JobRequest("train_retriever", "msmarco", 4, 16, 128000, 480, "gpu", None)
    assert refusals([four], CONFIG, facts) == [
        "rule train_retriever (dataset msmarco): no node of partition gpu takes jobs (sinfo %t: g001 (drain), "
        "g002 (drain), g009 (down*)); fix: wait until its nodes are back, or set cluster.gpu_partition in "
        f"{site_label()} to another partition"]

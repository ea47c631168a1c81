"""Each stage declared once (src/dpr_pipeline/stages.py): the lists the workflow uses follow from it, and the
parsed
workflow agrees with it (a rule that asks for a GPU runs in the CUDA environment and on the GPU partition; a CPU
rule in neither)."""

import json
import subprocess
import sys

import pytest
import yaml
from conftest import REPO

from dpr_pipeline.evaluation.seed_spread import SEEDED_STAGES
from dpr_pipeline import stages
from dpr_pipeline.orchestration.config import shared_only, validate_config
from dpr_pipeline.pretraining.methods import METHODS
from dpr_pipeline.orchestration.stage_settings import biencoder

PROFILE = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
SCHEMA = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())
GPU_ENV = f"../{stages.GPU_ENV}"  # as a rule in rules/ names it


def test_the_stage_lists_follow_from_the_declaration():
    assert stages.chain() == ["bm25", "start", "retriever1", "retriever2", "reranker", "distill"]
    assert stages.chain(stages.BIENCODER) == ["start", "retriever1", "retriever2", "distill"]
    assert stages.chain(stages.CROSS_ENCODER) == ["reranker"]
    assert stages.trained() == ["retriever1", "retriever2", "reranker", "distill"]
    assert stages.trained_by("train_retriever") == ["retriever1", "retriever2"]
    assert stages.STAGE_LABELS["distill"] == "Retriever_distill" and list(stages.STAGE_LABELS) == stages.chain()
    assert SEEDED_STAGES == {"retriever1": "retriever1", "retriever2": "retriever2", "reranker": "reranker",
                             "distill": "distill"}
    assert stages.STAGE_BELOW == {"retriever1": "start", "retriever2": "retriever1", "reranker": "retriever2",
                           "distill": "retriever2"}


def test_what_feeds_each_stage_and_the_mined_stages_follow_from_the_declaration():
    assert {s.name: s.fed_by for s in stages.CHAIN + stages.FAMILIES if s.fed_by} == {
        "retriever1": "bm25", "retriever2": "retriever1", "reranker": "retriever2", "distill": "retriever2",
        "ablation": "bm25"}
    assert stages.mined() == ["bm25", "retriever1", "retriever2"]
    assert stages.mined(stages.BIENCODER) == ["retriever1", "retriever2"]
    assert stages.fed_by("retriever2") == ["reranker"]              # the distilled retriever through its teacher
    assert stages.teacher() == "reranker" and stages.starting_stage() == "start"
    assert stages.starts_named_by("distill") == ("retriever1", "retriever2") and stages.starts_named_by("retriever") == ()
    assert stages.starts_named_by("retriever2") == ("retriever1",) and stages.starts_named_by("retriever1") == ()
    assert stages.trained_with("retriever") == ["retriever1", "retriever2"]
    assert stages.blocks(stages.BIENCODER) == ["retriever", "retriever1", "retriever2", "distill"]
    assert stages.overriding_blocks() == ["retriever1", "retriever2"]
    assert stages.shared_block("retriever2") == "retriever" and stages.shared_block("distill") is None


def test_the_schemas_mining_blocks_are_the_mined_stages():
    assert list(SCHEMA["$defs"]["mining"]["properties"]) == stages.mined()


def test_every_training_rule_names_its_function_and_settings_class_and_every_trained_stage_has_one():
    """The registry names them by import path (stages.py imports neither): each path resolves."""
    from dpr_pipeline.pretraining.settings import PretrainSettings
    from dpr_pipeline.pretraining.train import pretrain
    from dpr_pipeline.training.biencoder import train_biencoder
    from dpr_pipeline.training.cross_encoder import train_reranker
    from dpr_pipeline.training.settings import BiEncoderSettings, DistillSettings, RerankerSettings

    assert {s.trainer for s in stages.CHAIN + stages.FAMILIES if s.trains} == set(stages.TRAINERS)
    assert {name: (stages.training_function(name), stages.settings_class(name))
            for name in ("retriever1", "retriever2", "ablation/mlm", "distill", "reranker", "pretrain/simlm")} == {
        "retriever1": (train_biencoder, BiEncoderSettings), "retriever2": (train_biencoder, BiEncoderSettings),
        "ablation/mlm": (train_biencoder, BiEncoderSettings), "distill": (train_biencoder, DistillSettings),
        "reranker": (train_reranker, RerankerSettings), "pretrain/simlm": (pretrain, PretrainSettings)}


def test_a_family_members_name_is_built_and_read_in_one_place():
    assert stages.member(stages.ABLATION, "simlm") == "ablation/simlm"
    assert stages.members(stages.PRETRAINING, ["mlm", "{method}"]) == ["pretrain/mlm", "pretrain/{method}"]
    assert stages.family_member("ablation/none") == (stages.ABLATION, "none")
    for other in ("retriever1", "ablation", "ablation/", "colbert/simlm", "pretrain/simlm/model"):
        assert stages.family_member(other) is None
    assert stages.settings_block("pretrain/simlm") == "pretrain" and stages.settings_block("distill") == "distill"
    assert stages.settings_block("training") is None and stages.settings_block(None) is None


def test_every_trained_stage_declares_its_loss_title_and_every_model_its_card_text():
    assert {name: stages.training_loss(name) for name in ("retriever1", "distill", "pretrain/cdmae")} == {
        "retriever1": "Retriever₁ (BM25 negatives): contrastive loss, Eq. 3",
        "distill": "Retriever_distill: KL to the teacher + α · contrastive, Eq. 5",
        "pretrain/cdmae": "Pre-training (cdmae): its pre-training objective"}
    assert all(s.loss for s in stages.CHAIN + stages.FAMILIES if s.trains)
    assert all(s.card_negatives for s in stages.CHAIN + stages.FAMILIES if s.trains and s is not stages.PRETRAINING)
    assert stages.card_name("reranker") == "the cross-encoder re-ranker"
    assert stages.card_name("ablation/mlm") == "Retriever₁ of the pre-training ablation (`ablation/mlm`)"


def test_gpu_rules_and_their_env_follow_from_the_declaration():
    assert stages.GPU_TRAINING_RULES == {"train_retriever": "retriever", "train_reranker": "reranker",
                                         "train_distill": "distill", "pretrain": "pretrain"}
    assert stages.GPU_INFERENCE_RULES == ("encode_corpus", "dense_search", "rerank", "teacher_scores_shard",
                                          "denoise_scores")
    assert {rule: stages.torch_env(rule) for rule in ("pretrain", "encode_corpus", "build_index")} == {
        "pretrain": "envs/torch-gpu.yaml", "encode_corpus": "envs/torch-gpu.yaml", "build_index": "envs/torch.yaml"}
    assert (REPO / stages.GPU_ENV).is_file() and (REPO / stages.CPU_TORCH_ENV).is_file()


def test_family_members_resolve_to_their_family_and_an_unknown_stage_is_named():
    assert stages.stage("ablation/cdmae") is stages.ABLATION and stages.stage("pretrain/simlm") is stages.PRETRAINING
    assert stages.stage("distill").block == "distill" and stages.stage("ablation/none").block == "retriever"
    for unknown in ("colbert", "ablation", "pretrain"):
        with pytest.raises(KeyError, match=f"stage '{unknown}' is not declared"):
            stages.stage(unknown)


def test_a_biencoder_reads_its_declared_block():
    config = validate_config({"run_datasets": ["a"],
                              "datasets": {"a": {"format": "beir", "path": "data/scifact", "train_split": "train",
                                                 "eval_splits": ["test"]}}})
    assert biencoder(config, "a", "distill")["alpha"] == 0.2                  # the distill block
    assert biencoder(config, "a", "ablation/mlm")["epochs"] == 3             # the retriever block


def test_the_schemas_stage_lists_are_the_registrys():
    """The schema's lists of stages and blocks, written out (docs/configuration.md is made from them), each as the
    registry declares them: the transfer's stages (the chain's with a model, then the ablation's rows), and the
    blocks of ``stages`` and of a dataset's ``stages``."""
    enum = SCHEMA["properties"]["transfer"]["properties"]["stages"]["items"]["enum"]
    with_model = [s.name for s in stages.CHAIN if s.kind in (stages.BIENCODER, stages.CROSS_ENCODER)]
    rows = SCHEMA["$defs"]["pretrain"]["properties"]["ablation_methods"]["items"]["enum"]
    assert rows == ["none", *METHODS]
    assert enum == with_model + stages.members(stages.ABLATION, rows)
    declared = {s.block for s in stages.CHAIN + stages.FAMILIES} | {s.shares for s in stages.CHAIN if s.shares}
    for properties in (SCHEMA["properties"]["stages"]["properties"],
                       SCHEMA["$defs"]["dataset"]["properties"]["stages"]["properties"]):
        assert set(properties) == declared | {"mining", "selection"}


def test_the_settings_a_stages_own_block_cannot_set_follow_from_its_settings_class():
    assert shared_only(SCHEMA) == {"retriever": ["processes", "nodes", "search_depth", "encode_shards",
                                                 "encode_batch_size", "embedding_dtype", "index"]}


# ------------------------------------------------------------------------------- the parsed workflow


def asks_for_gpus(rule: dict) -> bool:
    return rule["gpu"] == "per job" or (rule["gpu"] or 0) > 0


def env_mismatches(rules: dict[str, dict]) -> list[str]:
    """The rules whose conda env contradicts their GPUs: a GPU rule in a CPU env, or a CPU rule in the GPU env."""
    return sorted(name for name, rule in rules.items() if asks_for_gpus(rule) != (rule["conda_env"] == GPU_ENV))


@pytest.fixture(scope="module")
def parsed_rules() -> dict[str, dict]:
    """Every rule of this checkout's workflow with its GPUs and conda env, as Snakemake parses them."""
    done = subprocess.run([sys.executable, "scripts/dag_plan.py", "--rules"], cwd=REPO, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


def test_the_check_catches_a_gpu_rule_in_the_cpu_env():
    # pretrain before issue 25: GPUs from cluster.py and the Slurm profile, the CPU env in rules/pretrain.smk
    rules = {"pretrain": {"gpu": "per job", "conda_env": "../envs/torch.yaml"},
             "build_index": {"gpu": 0, "conda_env": GPU_ENV}, "encode_corpus": {"gpu": 1, "conda_env": GPU_ENV},
             "evaluate": {"gpu": 0, "conda_env": "../envs/eval.yaml"}}
    assert env_mismatches(rules) == ["build_index", "pretrain"]


def test_every_gpu_rule_runs_in_the_gpu_env_and_every_cpu_rule_outside_it(parsed_rules):
    assert env_mismatches(parsed_rules) == []


def test_the_rules_that_ask_for_gpus_are_the_declared_ones_and_their_copies(parsed_rules):
    with_gpus = {name for name, rule in parsed_rules.items() if asks_for_gpus(rule)}
    assert set(stages.GPU_RULES) <= with_gpus
    # `use rule encode_corpus as transfer_encode_corpus` (rules/transfer.smk) keeps the rule's resources
    copies = with_gpus - set(stages.GPU_RULES)
    assert copies and all(any(name.endswith(f"_{rule}") for rule in stages.GPU_RULES) for name in copies), copies
    trainers = {name for name, rule in parsed_rules.items() if rule["gpu"] == "per job"}
    assert trainers == set(stages.GPU_TRAINING_RULES)


def test_the_config_puts_exactly_the_gpu_rules_on_the_gpu_partition(tmp_path):
    """config cluster.gpu_partition / cpu_partition: every rule that asks for GPUs on the one, every other rule on
    the other; the Slurm profile names no partition (nothing in it is specific to one cluster)."""
    (tmp_path / "cluster.yaml").write_text("cluster: {gpu_partition: gpu-a100, cpu_partition: cpu}\n")
    done = subprocess.run([sys.executable, "scripts/dag_plan.py", "--rules", "--configfile",
                           str(tmp_path / "cluster.yaml")], cwd=REPO, capture_output=True, text=True, check=True)
    rules = json.loads(done.stdout)
    on_gpu = {name for name, rule in rules.items() if rule["slurm_partition"] == "gpu-a100"}
    with_gpus = {name for name, rule in rules.items() if asks_for_gpus(rule)}
    assert on_gpu == with_gpus
    cluster_rules = {name for name, rule in rules.items() if rule["slurm_partition"] is not None}
    assert all(rules[name]["slurm_partition"] == "cpu" for name in cluster_rules - with_gpus)
    assert {"ingest_corpus", "evaluate", "bm25_search"} <= cluster_rules - with_gpus
    assert "slurm_partition" not in json.dumps(PROFILE)


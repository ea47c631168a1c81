"""The parameters each job gets (dpr_pipeline.orchestration.stage_settings), from a validated config without Snakemake."""

import copy
import re

import pytest

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.orchestration import stage_settings as settings
from dpr_pipeline.orchestration.config import validate_config
from dpr_pipeline.training.settings import BiEncoderSettings

BASE = {
    "datasets": {
        "a": {"format": "beir", "path": "data/scifact", "train_split": "train", "eval_splits": ["test"],
              "stages": {"retriever": {"plm": "pretrain", "search_depth": 500, "encode_shards": 2},
                         "distill": {"plm": "some/hub-model"},
                         "mining": {"retriever2": {"depth": 50}}}},
        "b": {"format": "beir", "path": "data/scifact", "eval_splits": ["test"],
              "stages": {"retriever": {"search_depth": 100, "encode_shards": 3, "index": {"kind": "hnsw"},
                                       "encode_batch_size": 8}}},
    },
    "run_datasets": ["a"],
    "transfer": {"rerank_depth": 30},
}


@pytest.fixture
def config():
    return validate_config(copy.deepcopy(BASE))


def test_bi_encoders_start_from_their_block_plm_resolved_to_the_workflow_output(config):
    simlm = "results/a/pretrain/simlm/model"
    for stage in ("start", "retriever1", "retriever2"):
        assert settings.initialisation(config, "a", stage) == simlm
        assert settings.bi_encoder_block(config, "a", stage)["plm"] == simlm
        assert settings.bi_encoder_block(config, "a", stage)["learning_rate"] == 2e-5      # the retriever block
    assert settings.biencoder(config, "a", "retriever2")["plm"] == simlm          # the training job's
    # a Hub name: the folder its fetch job writes (model_fetch.py)
    assert settings.biencoder(config, "a", "distill")["plm"] == "data/models/some--hub-model"
    assert settings.biencoder(config, "a", "distill")["alpha"] == 0.2               # the distill block
    assert settings.initialisation(config, "a", "ablation/cdmae") == "results/a/pretrain/cdmae/model"
    assert settings.initialisation(config, "a", "ablation/none") == "data/models/bert-base-uncased"   # pretrain.plm


def test_training_processes_come_from_the_stage_block(config):
    config["datasets"]["a"]["stages"]["distill"]["processes"] = 4
    assert settings.training_processes(config, "a", "distill") == 4
    assert settings.training_processes(config, "a", "reranker") == 1


def test_a_pretraining_job_trains_its_own_method(config):
    assert settings.pretrain(config, "a")["method"] == "simlm"
    assert settings.pretrain(config, "a", "cdmae")["method"] == "cdmae"
    assert settings.pretraining_in_chain(config, "a") == ["pretrain/simlm"]
    config["datasets"]["a"]["stages"]["retriever"]["plm"] = "x"
    config["datasets"]["a"]["stages"]["distill"]["plm"] = "y"
    assert settings.pretraining_in_chain(config, "a") == []


def test_a_drawn_start_is_what_pretraining_and_the_none_row_load(config):
    assert settings.pretraining_start(config, "a") is None
    assert settings.pretrain(config, "a")["plm"] == "data/models/bert-base-uncased"  # the plm, fetched
    config["datasets"]["a"]["stages"]["pretrain"] = {"plm": "some/hub-model", "reinitialize_layers": 2}
    start = "results/a/pretrain_start/model"
    assert settings.pretraining_start(config, "a") == {"plm": "data/models/some--hub-model", "layers": 2, "seed": 0,
                                                       "model": start, "max_length": 144}
    assert settings.pretrain(config, "a", "mlm")["plm"] == start
    assert settings.initialisation(config, "a", "ablation/none") == start
    # the jobs get the start, not the keys that draw it: a release adding them reruns no pre-training job
    assert not {"reinitialize_layers", "reinitialize_seed"} & set(settings.pretrain(config, "a"))


def test_torch_compile_of_pretraining_is_off_unless_a_dataset_asks_for_it(config):
    assert settings.pretrain(config, "a")["compile"] is False
    config["datasets"]["a"]["stages"]["pretrain"] = {"compile": True}
    assert settings.pretrain(config, "a", "mlm")["compile"] is True


def test_a_transfer_job_keeps_the_model_side_and_takes_the_target_corpus_side(config):
    own = settings.encoding(config, "a")
    assert (own["encode_shards"], own["search_depth"], own["index"]["kind"]) == (2, 500, "flat")
    transfer = settings.encoding(config, "a", "b")
    assert (transfer["encode_shards"], transfer["search_depth"], transfer["index"]["kind"]) == (3, 100, "hnsw")
    assert transfer["encode_batch_size"] == own["encode_batch_size"] == 256          # A's, not B's 8
    assert transfer["index"]["hnsw_m"] == 32       # B overrode one key of the index block: the rest keep defaults
    assert settings.reranker(config, "a")["rerank_depth"] == 200
    assert settings.reranker(config, "a", "b")["rerank_depth"] == 30                 # transfer.rerank_depth


def test_a_transfer_job_encodes_at_the_lengths_its_target_declares(config):
    """Issue 52: B's queries were encoded at A's query_max_length. A transfer job gets B's transfer_max_length
    (null by default: the model's own max_seq_length, resolved by the job); A's own jobs get no such key, so their
    params, and the jobs Snakemake plans for them, are as before."""
    assert "transfer_max_length" not in settings.encoding(config, "a")
    assert settings.encoding(config, "a", "b")["transfer_max_length"] == {"query": None, "passage": None}
    declared = copy.deepcopy(BASE)
    declared["datasets"]["b"]["transfer_max_length"] = {"query": 512}
    loaded = validate_config(declared)
    assert settings.encoding(loaded, "a", "b")["transfer_max_length"] == {"query": 512, "passage": None}
    declared["datasets"]["b"]["transfer_max_length"] = {"query": 1}
    with pytest.raises(ConfigError, match=r"datasets.b.transfer_max_length.query: 1 is less than the minimum of 2"):
        validate_config(declared)


def test_mining_settings_per_mined_stage_and_the_depth_a_mined_train_split_is_searched_to(config):
    assert settings.mining(config, "a", "bm25") == {"depth": 200, "keep": 30, "seed": 42}
    assert settings.mining(config, "a", "retriever1") == {"depth": 200, "keep": 200, "seed": 42}
    assert settings.mining(config, "a", "retriever2") == {"depth": 50, "keep": 200, "seed": 42}  # one key overridden
    assert settings.search_depth(config, "a", "bm25", "train") == 200        # only mined: stops at mining depth
    assert settings.search_depth(config, "a", "bm25", "test") == 1000
    assert settings.search_depth(config, "a", "retriever1", "train") == 200
    assert settings.search_depth(config, "a", "retriever2", "train") == 50
    assert settings.search_depth(config, "a", "retriever2", "test") == 500
    assert settings.search_depth(config, "a", "distill", "train") == 500     # not mined: the full depth
    assert settings.search_depth(config, "a", "retriever2", "test", "b") == 100   # transfer: B's depth


def test_mining_filters_reach_the_job_only_when_set():
    config = copy.deepcopy(BASE)
    config["datasets"]["a"]["stages"]["mining"]["retriever1"] = {"relative_margin": 0.05, "range_min": 0}
    config = validate_config(config)
    assert settings.mining(config, "a", "retriever1") == {"depth": 200, "keep": 200, "seed": 42,
                                                          "relative_margin": 0.05, "range_min": 0}
    assert settings.mining(config, "a", "retriever2") == {"depth": 50, "keep": 200, "seed": 42}   # off: not handed on
    assert settings.mining(config, "a", "bm25") == {"depth": 200, "keep": 30, "seed": 42}


@pytest.mark.parametrize("key, value, problem", [("relative_margin", 1.0, "greater than or equal to the maximum of 1"),
                                                 ("relative_margin", -0.05, "less than the minimum of 0"),
                                                 ("absolute_margin", -1, "less than the minimum of 0"),
                                                 ("range_min", 2.5, "not of type 'integer', 'null'")])
def test_a_mining_filter_out_of_range_is_one_error_naming_the_key(key, value, problem):
    config = copy.deepcopy(BASE)
    config["datasets"]["a"]["stages"]["mining"]["retriever1"] = {key: value}
    message = rf"mining\.retriever1\.{key}: {re.escape(repr(value))} is {problem}"
    with pytest.raises(ConfigError, match=message) as error:
        validate_config(config)
    assert "Fix: " in str(error.value)
    if key == "relative_margin":
        assert str(error.value).endswith("Fix: use a value >= 0 and < 1 (null: off)")


def test_a_train_split_also_evaluated_is_searched_to_the_full_depth(config):
    config["datasets"]["a"].update(eval_splits=["test", "train"], allow_overlap=True)
    assert settings.search_depth(config, "a", "retriever2", "train") == 500


@pytest.mark.parametrize("stage, key, new", [
    ("bm25", "negatives_depth", "mining.bm25.depth"),
    ("bm25", "negatives_per_query", "mining.bm25.keep"),
    ("retriever", "mined_negatives_per_query", "mining.retriever1.keep"),
    ("reranker", "negatives_depth", "mining.retriever2.depth"),
])
def test_a_setting_in_its_old_place_names_its_new_one(stage, key, new):
    config = copy.deepcopy(BASE)
    config["datasets"]["a"]["stages"].setdefault(stage, {})[key] = 7
    with pytest.raises(ConfigError, match=rf"datasets\.a\.stages\.{stage}\.{key} has moved to "
                                          rf"datasets\.a\.stages\.{new}.*write `{new.rsplit('.', 1)[1]}: 7`"):
        validate_config(config)
    config = copy.deepcopy(BASE)
    config["stages"] = {stage: {key: 7}}
    with pytest.raises(ConfigError, match=rf"config key stages\.{stage}\.{key} has moved to stages\.{new}"):
        validate_config(config)


def test_the_bi_encoder_blocks_share_one_fragment_and_still_reject_unknown_keys():
    for stage in ("retriever", "distill", "reranker"):
        config = copy.deepcopy(BASE)
        config["stages"] = {stage: {"tempature": 0.1}}
        with pytest.raises(ConfigError, match=rf"stages\.{stage}: .*'tempature' was unexpected"):
            validate_config(config)
    config = copy.deepcopy(BASE)
    config["datasets"]["a"]["stages"]["distill"]["negatives_per_query"] = 0     # distill's own minimum: 1
    with pytest.raises(ConfigError, match=r"distill\.negatives_per_query: 0 is less than the minimum of 1"):
        validate_config(config)
    config["datasets"]["a"]["stages"]["distill"]["negatives_per_query"] = 1
    config["datasets"]["a"]["stages"]["retriever"]["negatives_per_query"] = 0   # the retriever's may be 0
    validated = validate_config(config)
    assert validated["stages"]["retriever"]["epochs"] == 3 and validated["stages"]["distill"]["epochs"] == 6
    assert validated["stages"]["reranker"]["warmup_steps"] == 1000              # from the shared training fragment


def test_no_setting_has_its_default_in_two_places():
    """Snakemake fills the first default it meets: a block and a fragment it uses must not both give one."""
    import yaml

    from dpr_pipeline.orchestration.config import SCHEMA_PATH

    defs = yaml.safe_load(SCHEMA_PATH.read_text())["$defs"]

    def defaulted(block: dict) -> list[str]:
        keys = [key for key, value in block.get("properties", {}).items() if "default" in value]
        for part in block.get("allOf", []):
            keys += defaulted(defs[part["$ref"].rsplit("/", 1)[1]])
        return keys

    blocks = [defs[name] for name in ("retriever", "reranker", "distill")] + list(defs["mining"]["properties"].values())
    for block in blocks:
        keys = defaulted(block)
        assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    assert "keep" in defaulted(defs["mining"]["properties"]["bm25"])


def test_the_student_may_continue_from_a_retriever_of_its_own_dataset():
    config = copy.deepcopy(BASE)
    config["datasets"]["a"]["stages"]["distill"]["plm"] = "retriever2"
    config = validate_config(config)
    assert settings.initialisation(config, "a", "distill") == "results/a/retriever2/model"
    assert settings.initialisation(config, "a", "retriever2") == "results/a/pretrain/simlm/model"


def test_retriever2_may_continue_from_retriever1_of_its_own_dataset():
    config = copy.deepcopy(BASE)
    config["datasets"]["a"]["stages"]["retriever2"] = {"plm": "retriever1"}
    config = validate_config(config)
    assert settings.initialisation(config, "a", "retriever2") == "results/a/retriever1/model"
    assert settings.biencoder(config, "a", "retriever2")["plm"] == "results/a/retriever1/model"
    for stage in ("start", "retriever1", "ablation/none"):   # the others keep their start
        assert "retriever1/model" not in settings.initialisation(config, "a", stage)


@pytest.mark.parametrize("start, fix", [("retriever1", "write `plm: retriever1` under datasets.a.stages.retriever2"),
                                        ("plm", "Retriever2 starts from the plm of datasets.a.stages.retriever2")])
def test_the_old_retriever2_start_names_its_new_place(start, fix):
    config = copy.deepcopy(BASE)
    config["datasets"]["a"]["stages"]["retriever"]["retriever2_start"] = start
    with pytest.raises(ConfigError, match=re.escape("datasets.a.stages.retriever.retriever2_start has moved") +
                       ".*" + re.escape(f"Fix: {fix} and delete retriever2_start")):
        validate_config(config)


def test_the_gone_pool_depth_says_so():
    config = copy.deepcopy(BASE)
    config["datasets"]["a"]["stages"]["selection"] = {"pool_depth": 10}
    with pytest.raises(ConfigError, match=re.escape("config key datasets.a.stages.selection.pool_depth is gone: the "
                                                    "dev selection searches the whole corpus") + ".*Fix: delete it"):
        validate_config(config)


def test_each_retriever_has_its_own_settings_over_the_shared_ones():
    """``stages.retriever1``/``retriever2`` override ``retriever`` at either level; the stage's own setting wins
    wherever each is written, and a typo or a shared-only key in an own block stops with its key."""
    config = copy.deepcopy(BASE)
    config["stages"] = {"retriever2": {"learning_rate": 1.0e-5}}
    config["datasets"]["a"]["stages"]["retriever"]["learning_rate"] = 3.0e-5
    config["datasets"]["a"]["stages"]["retriever1"] = {"epochs": 7}
    config = validate_config(config)
    r1, r2 = (settings.biencoder(config, "a", stage) for stage in ("retriever1", "retriever2"))
    assert (r1["learning_rate"], r1["epochs"]) == (3.0e-5, 7)
    assert (r2["learning_rate"], r2["epochs"]) == (1.0e-5, config["stages"]["retriever"]["epochs"])
    for own, message in [({"learnin_rate": 1}, "learnin_rate"),
                         ({"encode_shards": 2}, "datasets.a.stages.retriever1.encode_shards: every stage that shares "
                                                "retriever uses the same encode_shards. Fix: set it under "
                                                "datasets.a.stages.retriever")]:
        broken = copy.deepcopy(BASE)
        broken["datasets"]["a"]["stages"]["retriever1"] = own
        with pytest.raises(ConfigError, match=re.escape(message)):
            validate_config(broken)


def test_a_stage_s_nodes_share_its_processes_evenly_and_reach_its_jobs():
    """`nodes` beside `processes`: both in the job's params (a change reruns the training, as for processes), the
    rules' GPUs per node from both; nodes that do not divide processes, or an own block setting the retrievers'
    shared nodes, stop at start-up with the key."""
    from dpr_pipeline.orchestration.training_job import job_settings

    config = copy.deepcopy(BASE)
    config["datasets"]["a"]["stages"]["retriever"].update(processes=4, nodes=2)
    config = validate_config(config)
    assert settings.training_nodes(config, "a", "retriever") == 2
    assert settings.training_nodes(config, "a", "pretrain") == 1                  # the default: one node
    params = settings.biencoder(config, "a", "retriever2")
    assert (params["processes"], params["nodes"]) == (4, 2)
    assert job_settings("retriever2", params).nodes == 2
    for block, own, message in [
            ("pretrain", {"processes": 8, "nodes": 3},
             "config key datasets.a.stages.pretrain.nodes: 3 nodes cannot share 8 processes evenly"),
            ("retriever1", {"nodes": 2}, "datasets.a.stages.retriever1.nodes: every stage that shares retriever uses "
                                         "the same nodes")]:
        broken = copy.deepcopy(BASE)
        broken["datasets"]["a"]["stages"][block] = {**broken["datasets"]["a"]["stages"].get(block, {}), **own}
        with pytest.raises(ConfigError, match=re.escape(message)):
            validate_config(broken)


@pytest.mark.parametrize("plm", ["retriever1", "retriever2"])
def test_a_retriever_cannot_start_from_a_model_its_own_block_trains(plm):
    config = copy.deepcopy(BASE)
    config["datasets"]["a"]["stages"]["retriever"]["plm"] = plm
    with pytest.raises(ConfigError, match=f"stages.retriever.plm: '{plm}' is a model this block trains"):
        validate_config(config)


def test_a_key_resolved_here_reaches_no_job_of_its_block(config):
    """Each settings function that turns a key into something else says so (``@resolves``); the key is then in no
    job's params of its block, and it names a key the block has (a misspelt one would leak the real one)."""
    assert {block: set(keys) for block, keys in settings.RESOLVED_HERE.items()} == {
        "reranker": {"teacher_pairs", "fusion_weight", "fusion_metric"},
        "pretrain": {"reinitialize_layers", "reinitialize_seed"},
        "distill": {"teacher", "pseudo_queries", "pseudo_query_source", "pseudo_query_min_words",
                    "pseudo_query_max_words"}}
    for block, keys in settings.RESOLVED_HERE.items():
        assert set(keys) <= config["stages"][block].keys()
        assert not set(keys) & settings.job_params(config, "a", block).keys()
    assert not set(settings.RESOLVED_HERE["reranker"]) & settings.reranker(config, "a", target="b").keys()


def test_the_rules_read_no_stage_block_themselves():
    """A job's stage parameters come from one function per stage (``settings.<stage>(…)``): no rule or input
    function reads ``config["stages"]`` or merges a block with ``stage_params`` (comments aside)."""
    from conftest import REPO

    for rules in sorted((REPO / "rules").glob("*.smk")):
        code = [line for line in rules.read_text().splitlines() if not line.lstrip().startswith("#")]
        assert not [line for line in code if re.search(r"""\["stages"\]|\.get\("stages"|stage_params\(""", line)
                    and 'config["transfer"]["stages"]' not in line], rules.name


def test_prompts_reach_a_bi_encoder_job_only_when_set(config):
    """`query_prompt` / `passage_prompt` left at null (the model's own) are kept out of the jobs' params, so a
    config that does not set them reruns nothing; set, they reach the stage's jobs ("" = none)."""
    for stage in ("start", "retriever1", "distill"):
        assert not {"query_prompt", "passage_prompt"} & settings.bi_encoder_block(config, "a", stage).keys()
    assert "query_prompt" not in settings.encoding(config, "a")
    config["datasets"]["a"]["stages"]["retriever"].update(query_prompt="query: ", passage_prompt="")
    config = validate_config(config)
    assert settings.biencoder(config, "a", "retriever1")["query_prompt"] == "query: "
    assert settings.starting_model(config, "a")["passage_prompt"] == ""
    assert "query_prompt" not in settings.biencoder(config, "a", "distill")        # the distill block's own
    config["datasets"]["a"]["stages"]["distill"]["query_prompt"] = 3
    with pytest.raises(ConfigError, match="query_prompt"):
        validate_config(config)


# ------------------------------------------------------------------ a job's params: exactly what it reads
#: Each job kind of the chain as its rule asks for its stage settings (rules/*.smk), with the blocks it is of.
JOBS = {
    ("starting_model", "start"): lambda c: settings.starting_model(c, "a"),
    **{(rule, stage): function
       for stage in ("start", "retriever1", "retriever2", "distill")
       for rule, function in [("encode_corpus", lambda c, s=stage: settings.encode_corpus(c, "a", s)),
                              ("dense_search", lambda c, s=stage: settings.dense_search(c, "a", s)),
                              ("build_index", lambda c, s=stage: settings.dense_index(c, "a"))]},
    ("train_retriever", "retriever1"): lambda c: settings.biencoder(c, "a", "retriever1"),
    ("train_retriever", "retriever2"): lambda c: settings.biencoder(c, "a", "retriever2"),
    ("train_distill", "distill"): lambda c: settings.biencoder(c, "a", "distill"),
    ("train_reranker", "reranker"): lambda c: settings.train_reranker(c, "a"),
    ("rerank", "reranker"): lambda c: settings.rerank(c, "a"),
    ("teacher_scores_shard", "reranker"): lambda c: settings.teacher_scores(c, "a"),
    ("tokenize_corpus", "pretrain"): lambda c: settings.tokenize_corpus(c, "a"),
    ("count_ngrams", "pretrain"): lambda c: settings.count_ngrams(c, "a"),
    ("pretrain", "pretrain"): lambda c: settings.pretrain(c, "a", "simlm"),
}
#: The block each job's stage reads its settings from, with the blocks it shares.
BLOCKS_OF = {"start": {"retriever"}, "retriever1": {"retriever", "retriever1"},
             "retriever2": {"retriever", "retriever2"}, "distill": {"distill"}, "reranker": {"reranker"},
             "pretrain": {"pretrain"}}


#: Keys a job reads through its resolved ``plm`` (`pretrain.method`: which pre-trained encoder the bi-encoders
#: start from, test_a_pretraining_job_trains_its_own_method), not as a key of its own.
RESOLVED_INTO_PLM = {("pretrain", "method")}


def changed(value):
    """Candidate other values of a setting, valid for most keys of its type."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1]
    if isinstance(value, float):
        return [value / 2]
    if isinstance(value, dict):
        return [{"kind": "hnsw"} if "kind" in value else {}]
    if isinstance(value, list):
        return [value[:1]]
    if value is None:
        return ["a: "]
    return ["some/other-model", "cls", "random", "float32", "mlm", "all", "bf16", "retriever1"]


def test_a_setting_changes_the_params_of_exactly_the_jobs_that_read_it():
    """For every key of every stage block (the shared `retriever`, Retriever1's and Retriever2's own, reranker,
    distill, pretrain): a job's params change exactly when the key is one it reads (in its params) from a block
    of its stage; so Snakemake reruns that job and what depends on it, never the untrained start for Retriever1's
    learning rate nor anything of Retriever1 for Retriever2's."""
    base = validate_config(copy.deepcopy(BASE))
    before = {job: function(base) for job, function in JOBS.items()}
    tried = 0
    for block in ("retriever", "retriever1", "retriever2", "reranker", "distill", "pretrain"):
        shared = "retriever" if block in ("retriever1", "retriever2") else block
        for key, value in settings.stage_params(base, "a", shared).items():
            if (block, key) in RESOLVED_INTO_PLM or key in settings.RESOLVED_HERE.get(shared, ()):
                continue  # read by the function that resolves them (test_a_key_resolved_here_reaches_no_job_…)
            for other in changed(value):
                config = copy.deepcopy(BASE)
                config["datasets"]["a"]["stages"].setdefault(block, {})[key] = other
                try:
                    config = validate_config(config)
                except ConfigError:
                    continue
                if settings.stage_params(config, "a", block)[key] == settings.stage_params(base, "a", block)[key]:
                    continue
                tried += 1
                after = {job: function(config) for job, function in JOBS.items()}
                moved = {job for job in JOBS if after[job] != before[job]}
                # (a prompt left at null is in no params: settings.ONLY_WHEN_SET)
                # (the corpus encoding, index and search of every bi-encoder stage: the `retriever` keys its
                # training does not read)
                reading = {job for job in JOBS if (key in before[job] or key in after[job]) and (
                    block in BLOCKS_OF[job[1]] or (block == "retriever" and key not in BiEncoderSettings.keys()))}
                assert moved == reading, f"{block}.{key} -> {other!r}"
                break
    assert tried >= 100

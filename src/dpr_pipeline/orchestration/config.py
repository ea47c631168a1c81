"""Configuration: schema validation (defaults filled in, unknown keys rejected) and per-stage parameters.

Stage values come from the top-level ``stages`` block (the SimLM paper's MS MARCO values by default),
overridden key by key by ``datasets.<name>.stages.<stage>``; the merged values are checked against the
same stage schema, so a mistyped key in an override is rejected by name too.
"""

from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path

import jsonschema
import yaml

from dpr_pipeline.data.dev_split import dev_split_of
from dpr_pipeline.data.fetch import raw_layout
from dpr_pipeline.data.readers import FORMATS, reader_of, split_files_problem
from dpr_pipeline.data.text_files import dataset_folder
from dpr_pipeline.errors import ConfigError, DataError
from dpr_pipeline.evaluation.metrics import parse_metric
from dpr_pipeline.models.refs import is_hub_name, resolve_model_path
from dpr_pipeline.pretraining.methods import METHODS, RANDOM_GENERATOR, pretraining_method
from dpr_pipeline.reranking.score_fusion import weight_setting
from dpr_pipeline.retrieval.negative_filters import NegativeFilters
from dpr_pipeline.layout import model_stage
from dpr_pipeline.training.nodes import processes_per_node
from dpr_pipeline.training.schedule import check_micro_batch
from dpr_pipeline.stages import (BIENCODER, CHAIN, FAMILIES, PRETRAINING, blocks, denoisers, family_member, mined,
                                 overriding_blocks, reads_mined, settings_class, shared_block, starts_named_by,
                                 trained_with)

SCHEMA_PATH = Path(__file__).resolve().parents[3] / "schemas" / "config.schema.yaml"


#: The settings that name a model, (block, key) -> the words it takes instead of a model reference (resolved by
#: :mod:`dpr_pipeline.orchestration.stage_settings` and the pre-training): ``pretrain``, and the trained stages a block's
# stages
#: may start from (their ``starts_from`` in :mod:`dpr_pipeline.stages`: ``distill.plm: retriever2``); any other
#: value is a model reference, checked by :func:`dpr_pipeline.models.refs.resolve_model_path` when the config is
#: loaded.
MODEL_SETTINGS = {("pretrain", "plm"): (), ("pretrain", "generator"): (RANDOM_GENERATOR,), ("reranker", "plm"): (),
                  **{(block, "plm"): ("pretrain", *starts_named_by(block)) for block in blocks(BIENCODER)}}
STAGE_WORDS = {word for words in MODEL_SETTINGS.values() for word in words}

# A dataset name is a folder under results/ (and data/): one safe path segment.
DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _path(error: jsonschema.ValidationError, prefix: str = "") -> str:
    return prefix + "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)


_BOUNDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}


def _schema_error(error: jsonschema.ValidationError, key: str) -> ConfigError:
    """``config key <key>: <problem>. Fix: <fix>`` for a schema violation, the same for every block."""
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        fix = (f"correct or remove the key; the keys allowed here are {allowed}" if allowed else
               "correct or remove the key")
    elif error.validator == "enum":
        fix = f"use one of {error.validator_value}"
    elif error.validator == "type":
        types = error.validator_value
        fix = f"write it as {types if isinstance(types, str) else ' or '.join(types)}"
    elif error.validator == "required":
        fix = "add the missing key"
    elif error.validator in _BOUNDS:
        bounds = " and ".join(f"{word} {error.schema[name]}" for name, word in _BOUNDS.items() if name in error.schema)
        nullable = "null" in error.schema.get("type", ())
        fix = f"use a value {bounds}" + (" (null: off)" if nullable else "")
    else:
        fix = "see the key's description in schemas/config.schema.yaml"
    return ConfigError(f"config key {key}: {error.message}. Fix: {fix}")


def stage_params(config: dict, dataset: str, stage: str) -> dict:
    """The settings of config block ``stage`` for ``dataset``: top-level stage values merged key by key with the
    dataset's, one level deep for a block of settings (``retriever.index``, ``mining.retriever2``), so an override
    of one of its keys keeps the others. A stage's own block (``retriever2``) starts from the block it overrides
    (``retriever``, both levels merged) and then merges its own top-level and dataset values: the stage's own
    setting wins over the shared one wherever each is written."""
    shared = shared_block(stage)
    merged = stage_params(config, dataset, shared) if shared else {}
    for values in (config["stages"].get(stage, {}), config["datasets"][dataset].get("stages", {}).get(stage, {})):
        for key, value in values.items():
            block = merged.get(key)
            merged[key] = {**block, **value} if isinstance(value, dict) and isinstance(block, dict) else value
    return merged


#: The keys of a trained stage's block that set its training rule's resources: one value per rule, its shared
#: block's where it has one (:data:`dpr_pipeline.stages.GPU_TRAINING_RULES`).
RULE_KEYS = ("processes", "nodes")


def shared_only(schema: dict) -> dict[str, list[str]]:
    """By shared block (``retriever``), the settings its stages' own blocks cannot override, in the schema's order:
    the rule's resources (:data:`RULE_KEYS`) and every key of the block that no stage's own settings class reads
    (the corpus encoding, index and search every bi-encoder stage shares)."""
    shared_only = {}
    for declared in CHAIN:
        if declared.shares:
            own = set(settings_class(declared.name).keys()) - set(RULE_KEYS)
            keys = _block_keys(schema, schema["$defs"][declared.shares])
            shared_only[declared.shares] = [key for key in keys if key not in own]
    return shared_only


def _block_keys(schema: dict, block: dict) -> list[str]:
    """A schema block's keys, those of the fragments it builds on (``allOf``) first."""
    keys = [key for fragment in block.get("allOf", [])
            for key in _block_keys(schema, schema["$defs"][fragment["$ref"].rsplit("/", 1)[1]])]
    return list(dict.fromkeys(keys + list(block.get("properties", {}))))


def check_own_blocks(config: dict, schema: dict) -> None:
    """A stage's own block (``stages.retriever2``, ``datasets.<d>.stages.retriever2``) sets no key of
    :func:`shared_only`."""
    fixed = shared_only(schema)
    for prefix, stages in _stage_blocks(config):
        for block in overriding_blocks():
            shared = shared_block(block)
            for key in fixed.get(shared, ()):
                if isinstance(stages, dict) and isinstance(stages.get(block), dict) and key in stages[block]:
                    raise ConfigError(f"config key {prefix}.{block}.{key}: every stage that shares {shared} "
                                      f"uses the same {key}. Fix: set it under {prefix}.{shared}")


def _stage_blocks(config: dict) -> list[tuple[str, object]]:
    """(prefix, stages mapping) of the top-level stages and of each dataset's."""
    return [("stages", config.get("stages"))] + [
        (f"datasets.{name}.stages", dataset.get("stages"))
        for name, dataset in (config.get("datasets") or {}).items() if isinstance(dataset, dict)]


# Settings that moved in 0.2, (stage, key) -> where they are now: a config still using one stops at start-up naming
# the new place (docs/migration.md) instead of the schema's bare "unexpected property".
MOVED_SETTINGS = {
    ("bm25", "negatives_depth"): "mining.bm25.depth",
    ("bm25", "negatives_per_query"): "mining.bm25.keep",
    ("bm25", "seed"): "mining.bm25.seed",
    ("retriever", "negatives_depth"): "mining.retriever1.depth",
    ("retriever", "mined_negatives_per_query"): "mining.retriever1.keep",
    ("reranker", "negatives_depth"): "mining.retriever2.depth",
    ("reranker", "mined_negatives_per_query"): "mining.retriever2.keep",
}


def check_moved_settings(config: dict) -> None:
    """Stop on a setting written where an earlier version kept it (MOVED_SETTINGS, ``retriever2_start``), naming
    its new place."""
    if not isinstance(config, dict):
        return
    for prefix, stages in _stage_blocks(config):
        chosen = stages.get("selection") if isinstance(stages, dict) else None
        if isinstance(chosen, dict) and "pool_depth" in chosen:
            raise ConfigError(f"config key {prefix}.selection.pool_depth is gone: the dev selection searches the "
                              "whole corpus, as the stage's dev search does (docs/migration.md). Fix: delete it")
        retriever = stages.get("retriever") if isinstance(stages, dict) else None
        if isinstance(retriever, dict) and "retriever2_start" in retriever:
            start = retriever["retriever2_start"]
            fix = ("write `plm: retriever1` under " if start == "retriever1" else "Retriever2 starts from the plm "
                   "of ") + f"{prefix}.retriever2"
            raise ConfigError(f"config key {prefix}.retriever.retriever2_start has moved: what Retriever2 starts "
                              f"from is the plm of its own block (docs/migration.md). Fix: {fix} and delete "
                              "retriever2_start")
        for (stage, key), new in MOVED_SETTINGS.items():
            if isinstance(stages, dict) and isinstance(stages.get(stage), dict) and key in stages[stage]:
                block, name = new.rsplit(".", 1)
                raise ConfigError(f"config key {prefix}.{stage}.{key} has moved to {prefix}.{new} (hard-negative "
                                  f"mining has its own block since 0.2; docs/migration.md). Fix: write `{name}: "
                                  f"{stages[stage][key]}` under {prefix}.{block} and delete it from {stage}")


def check_stage_overrides(config: dict, schema: dict) -> None:
    """Validate every dataset's merged stage parameters against the stage's schema (a stage's own block against
    the block it overrides: ``retriever2`` as ``retriever``)."""
    check_own_blocks(config, schema)
    for name, dataset in config["datasets"].items():
        for stage in dict.fromkeys([*dataset.get("stages", {}), *overriding_blocks()]):
            # the stage's block with the shared fragments it refers to (#/$defs/training, ...)
            validator = jsonschema.Draft202012Validator({**schema["$defs"][shared_block(stage) or stage],
                                                         "$defs": schema["$defs"]})
            for error in validator.iter_errors(stage_params(config, name, stage)):
                raise _schema_error(error, f"datasets.{name}.stages.{stage}{_path(error)}")
    missing = [d for d in config.get("run_datasets", []) if d not in config["datasets"]]
    if missing:
        raise ConfigError(f"config key run_datasets names undeclared dataset(s) {missing}; declare them under "
                          f"`datasets` (declared: {sorted(config['datasets'])})")
    check_transfer_targets(config)


def check_transfer_targets(config: dict) -> None:
    """Every ``datasets.<A>.transfer_to`` entry names another declared dataset, and A itself can train."""
    metric = config.get("transfer", {}).get("metric")
    metrics = config.get("evaluation", {}).get("metrics")
    if metric is not None and metrics is not None and metric not in metrics:
        raise ConfigError(f"config key transfer.metric: {metric!r} is not one of evaluation.metrics {metrics}; "
                          "add it there or choose one of them")
    for name, dataset in config["datasets"].items():
        targets = dataset.get("transfer_to", [])
        unknown = [t for t in targets if t not in config["datasets"]]
        if unknown:
            raise ConfigError(f"config key datasets.{name}.transfer_to names undeclared dataset(s) {unknown}; "
                              f"declare them under `datasets` (declared: {sorted(config['datasets'])})")
        if name in targets:
            raise ConfigError(f"config key datasets.{name}.transfer_to names {name!r} itself; its own evaluation "
                              f"is results/{name}/<stage>/metrics.json, list only other collections")
        if targets and "train_split" not in dataset:
            raise ConfigError(f"config key datasets.{name}.transfer_to: dataset {name!r} has no train_split "
                              "(evaluation-only), so it has no models to transfer; move transfer_to to the "
                              "dataset the models are trained on")


def train_split_of(config: dict, dataset: str, purpose: str = "training") -> str:
    """The train split of ``dataset``; an evaluation-only dataset (no ``train_split``) cannot train anything.

    ``purpose`` names what asked for it (a stage, a rule) in the error."""
    split = config["datasets"][dataset].get("train_split")
    if split is None:
        raise ConfigError(f"dataset {dataset!r} has no train split (datasets.{dataset}.train_split is not set: it is "
                          f"evaluation-only), so {purpose} cannot run on it. Fix: set datasets.{dataset}.train_split "
                          f"to a split with queries and qrels, or evaluate a model trained on another dataset on it "
                          f"with that dataset's transfer_to: [{dataset}] (results/<other>/<stage>/transfer/"
                          f"{dataset}/metrics.json)")
    return split


def check_config_values(config: dict) -> None:
    """Checks the schema cannot express: metric names ir-measures knows, ``split_files`` only for the roles a
    format renames (:func:`.readers.split_files_problem`), answer-based relevance only for a format with question
    files (dpr)."""
    for position, name in enumerate(config.get("evaluation", {}).get("metrics", [])):
        try:
            parse_metric(name)
        except ValueError as err:
            raise ConfigError(f"config key evaluation.metrics[{position}]: {err}") from None
    check_dataset_names(config)
    for name, dataset in config["datasets"].items():
        if dataset.get("relevance") == "answers" and not reader_of(raw_layout(dataset)).question_files:
            needed = " or ".join(f"`{n}`" for n, layout in FORMATS.items() if layout.question_files)
            raise ConfigError(f"config key datasets.{name}.relevance: `answers` needs format {needed} (the "
                              f"answers come from DPR's question files), the dataset is {dataset['format']!r}")
        problem = split_files_problem(dataset["format"], dataset.get("split_files"))
        if problem:
            raise ConfigError(f"config key datasets.{name}.split_files: {problem}")
        check_dataset_plan(config, name)


def check_dataset_names(config: dict) -> None:
    """Every dataset name is one safe path segment: it names the folder ``results/<name>/``, so a ``/`` would nest
    folders (``results/sci/fact/``) and ``..`` or a leading ``-`` or ``.`` would escape or hide them."""
    for name in config["datasets"]:
        if not DATASET_NAME.fullmatch(str(name)):
            raise ConfigError(f"config key datasets.{name}: the dataset name {str(name)!r} is not a safe folder name "
                              f"(it names results/{name}/). Fix: rename the dataset to match "
                              f"^{DATASET_NAME.pattern}$ (letters, digits, '.', '_' and '-', starting with a letter "
                              "or digit), e.g. "
                              f"{re.sub(r'[^A-Za-z0-9._-]+', '_', str(name)).lstrip('._-') or 'mydata'!r}")


def check_dataset_plan(config: dict, name: str) -> None:
    """Settings that cannot work for a dataset, caught before any job runs: its ``path`` a file, not a folder; the
    train split also an evaluation split (leakage, unless ``allow_overlap``); a warm-up as long as a fixed step
    budget (``train_steps``); a model setting that names no model (:func:`check_model_settings`); re-ranking
    deeper than the retriever searches."""
    dataset = config["datasets"][name]
    dataset_folder(dataset["path"])
    check_dev_split(dataset, name)
    train = dataset.get("train_split")
    if train is None:  # evaluation-only: nothing is trained on it
        return
    if train in dataset["eval_splits"] and dataset.get("allow_overlap", False) is not True:
        raise ConfigError(f"config key datasets.{name}.train_split: {train!r} is also one of its eval_splits "
                          f"{dataset['eval_splits']}, so the models would be evaluated on the queries they were "
                          f"trained on (leakage). Fix: train on another split, or set datasets.{name}.allow_overlap: "
                          "true if you mean it (a list of query ids allows only those queries, not a whole split)")
    if "stages" not in config:  # not validated yet (no defaults): the stage checks need the merged values
        return
    check_warmups(config, name)
    check_micro_batches(config, name)
    check_nodes(config, name)
    check_model_settings(config, name)
    check_denoise(config, name)
    check_fusion(config, name)
    check_selection_metric(config, name)
    rerank, search = stage_params(config, name, "reranker")["rerank_depth"], \
        stage_params(config, name, "retriever")["search_depth"]
    if rerank > search:
        raise ConfigError(f"config key datasets.{name}.stages.reranker.rerank_depth: {rerank} is deeper than the "
                          f"{search} hits per query that Retriever2 searches (retriever.search_depth), so the "
                          f"re-ranker would silently re-rank only {search}. Fix: set reranker.rerank_depth <= "
                          f"{search} or raise retriever.search_depth")


def check_warmups(config: dict, name: str) -> None:
    """Each trained stage with a fixed step budget (``train_steps``) warms up for at most half of it: the config
    key and the fix, at start-up (a budget in epochs is checked once the data is read:
    :func:`~dpr_pipeline.training.schedule.check_warmup`)."""
    for block in dict.fromkeys(s.block for s in CHAIN + FAMILIES if s.trainer is not None):
        params = stage_params(config, name, block)
        if params.get("train_steps") is not None and params.get("warmup_ratio") is None \
                and 2 * params["warmup_steps"] > params["train_steps"]:
            raise ConfigError(f"config key {setting_name(config, name, block, 'warmup_steps')}: "
                              f"{params['warmup_steps']} warm-up steps are more than half of the "
                              f"{params['train_steps']} training steps (train_steps), so most of the run would train "
                              f"below the peak learning rate. Fix: set warmup_ratio (e.g. 0.1) or warmup_steps at "
                              f"most {params['train_steps'] // 2}, or raise train_steps")


def check_micro_batches(config: dict, name: str) -> None:
    """Each trained stage's ``micro_batch_size`` divides its share of the batch, ``batch_size / processes``
    (:func:`~dpr_pipeline.training.schedule.check_micro_batch`): the config key and the fix, at start-up."""
    for stage in dict.fromkeys(s for s in CHAIN + FAMILIES if s.trainer is not None):
        params = stage_params(config, name, stage.block)
        processes = stage_params(config, name, stage.shares or stage.block)["processes"]
        check_micro_batch(params["batch_size"], processes, params.get("micro_batch_size"),
                          f"config key {setting_name(config, name, stage.block, 'micro_batch_size')}")


def check_nodes(config: dict, name: str) -> None:
    """Each trained stage's ``nodes`` divides its ``processes`` (every node runs as many,
    :func:`~dpr_pipeline.training.nodes.processes_per_node`): the config key and the fix, at start-up."""
    for block in dict.fromkeys(s.shares or s.block for s in CHAIN + FAMILIES if s.trainer is not None):
        params = stage_params(config, name, block)
        processes_per_node(params["processes"], params["nodes"],
                           f"config key {setting_name(config, name, block, 'nodes')}")


def check_model_settings(config: dict, name: str) -> None:
    """Every setting that names a model (MODEL_SETTINGS) as the dataset's jobs would read it, before any job runs:
    a word it takes (``pretrain``, ``retriever2``, ``random``), else a model reference that resolves
    (:func:`dpr_pipeline.models.refs.resolve_model_path`: a folder that exists is that folder and must be a model
    folder; a path that does not exist, an invalid Hub name or a missing ``pkg:`` package stops here). No network
    call: online a Hub name is only spelt right (its fetch job downloads it); offline (``HF_HUB_OFFLINE``) it must
    be fetched already for the datasets of ``run_datasets``, which
    :func:`dpr_pipeline.orchestration.hub_models.check_offline_fetches` checks once the settings resolve."""
    for (block, key), words in MODEL_SETTINGS.items():
        value = stage_params(config, name, block)[key]
        setting = setting_name(config, name, block, key)
        if value in words:
            continue
        takes = f"it takes {', '.join(f'`{w}`' for w in words)} or a model" if words else "it takes a model"
        if value in STAGE_WORDS and value in trained_with(block):
            starting = [f"{b}.plm" for (b, k), named in MODEL_SETTINGS.items() if k == "plm" and value in named]
            raise ConfigError(f"config key {setting}: {value!r} is a model this block trains "
                              f"({' and '.join(trained_with(block))} share it), so the stage would start from "
                              f"itself. Fix: start from `pretrain`, a Hub name or a folder; only "
                              f"{' or '.join(starting)} may name {value}")
        if value in STAGE_WORDS:
            raise ConfigError(f"config key {setting}: {value!r} is not a model this setting can start from ({takes}: "
                              "a folder, a Hugging Face Hub name or pkg:<module>). Fix: name a model there")
        made = family_member(model_stage(value, name) or "")
        if made is not None and made[0] is PRETRAINING and made[1] in METHODS:
            check_pretrained_model_setting(setting, block, key, made[1])
            continue  # the workflow makes it before the jobs that read it (rules/inputs.smk, model_inputs)
        near = difflib.get_close_matches(value.lower(), words, n=1, cutoff=0.75) \
            if "/" not in value and not Path(value).exists() else []
        if near:
            raise ConfigError(f"config key {setting}: {value!r} is neither a folder here nor one of the words this "
                              f"setting takes ({takes}), and would be looked up as a Hugging Face Hub name. Fix: "
                              f"write {near[0]!r} if you mean that")
        check_model_readable(f"config key {setting}", value)


def check_model_readable(key: str, reference: str) -> None:
    """``reference`` (a folder, ``pkg:`` model or Hub name) resolves without the network; else a ConfigError
    naming ``key`` with the loader's message and fix."""
    try:
        resolve_model_path(reference, offline_cache=False)
    except DataError as err:
        raise ConfigError(f"{key}: {err}") from None


def fill_denoise_defaults(config: dict, schema: dict) -> None:
    """The schema's defaults in every ``mining.<stage>.denoise`` block that is on (top level and per dataset), in
    place: the validator fills no default inside a block that may be null."""
    defaults = {key: spec["default"] for key, spec in schema["$defs"]["denoise"]["properties"].items()
                if "default" in spec}
    for _, stages in _stage_blocks(config):
        for block in ((stages or {}).get("mining") or {}).values():
            if isinstance(block, dict) and isinstance(block.get("denoise"), dict):
                block["denoise"] = {**defaults, **block["denoise"]}


def check_denoise(config: dict, name: str) -> None:
    """Each mined stage's ``denoise`` (``mining.<stage>.denoise``): a threshold on (the filters' own checks,
    :class:`dpr_pipeline.retrieval.negative_filters.NegativeFilters`) and a model the mining can read. A chain
    stage's model (``reranker``, or its folder ``results/<dataset>/reranker/model``) that depends on the stage's
    mined negatives would make the mining wait for itself (the re-ranker trains on Retriever2's negatives, which
    Retriever1's train and BM25's before them): refused, naming the key and the fix; so is a Hub name (no fetch
    job fetches it) and a folder that is no model."""
    mining = stage_params(config, name, "mining")
    for stage in mined():
        denoise = mining.get(stage, {}).get("denoise")
        if denoise is None:
            continue
        own = "denoise" in config["datasets"][name].get("stages", {}).get("mining", {}).get(stage, {})
        setting = f"{f'datasets.{name}.stages' if own else 'stages'}.mining.{stage}.denoise"
        NegativeFilters.from_settings(mining[stage], setting.removesuffix(".denoise"))
        model = denoise["model"]
        made_by = model if model in denoisers() else model_stage(model, name)
        if made_by is not None:
            if made_by in denoisers() and not reads_mined(made_by, stage):
                continue
            why = (f"{made_by!r} trains on {stage}'s mined negatives (or on a model that does)"
                   if made_by in [s.name for s in CHAIN] and reads_mined(made_by, stage) else
                   f"{model!r} is a model this workflow makes for {name}, not a cross-encoder that can score the pool")
            raise ConfigError(f"config key {setting}.model: {why}, so mining {stage} would wait for its own output "
                              f"(a cycle). Fix: name a cross-encoder folder made outside this chain (a re-ranker "
                              f"an earlier run trained, copied out of results/, or a sentence-transformers "
                              f"CrossEncoder), or `reranker` only on a stage mined after the re-ranker")
        if is_hub_name(model):
            near = difflib.get_close_matches(model, denoisers(), n=1, cutoff=0.75)
            hint = f"write {near[0]!r} if you mean the chain's {near[0]}, or " if near else ""
            raise ConfigError(f"config key {setting}.model: {model!r} is neither a folder here nor "
                              f"{' or '.join(repr(d) for d in denoisers())}, and Hub names are not fetched for "
                              f"denoising. Fix: {hint}download the model into a folder (`huggingface-cli download "
                              f"{model} --local-dir models/{model.replace('/', '--')}`) and name that folder")
        check_model_readable(f"config key {setting}.model", model)


def check_pretrained_model_setting(setting: str, block: str, key: str, method: str) -> None:
    """A model setting may name an encoder this workflow pre-trains on the dataset
    (``results/<dataset>/pretrain/<method>/model``: the encoder with its LM head), unless the job that makes it
    would read it: pre-training's ``plm`` (every method, and the tokens, start from it), or a generator that the
    method itself takes."""
    if block == "pretrain" and (key == "plm" or pretraining_method(method).generator):
        reads = ("every pre-training method and the tokens start from pretrain.plm" if key == "plm" else
                 f"`{method}` takes a generator, which would be its own output")
        raise ConfigError(f"config key {setting}: the encoder that `{method}` pre-trains cannot be read by its own "
                          f"pre-training ({reads}). Fix: name the encoder of a method without a generator (such "
                          f"as results/<dataset>/pretrain/mlm/model), a Hub name or a folder")


def setting_name(config: dict, dataset: str, block: str, key: str) -> str:
    """Where a dataset's stage setting is set, as a config key: its override, else the top-level block (for a
    stage's own block that sets neither, the block it overrides)."""
    if key in config["datasets"][dataset].get("stages", {}).get(block, {}):
        return f"datasets.{dataset}.stages.{block}.{key}"
    shared = shared_block(block)
    if shared and key not in config["stages"].get(block, {}):
        return setting_name(config, dataset, shared, key)
    return f"stages.{block}.{key}"


def check_dev_split(dataset: dict, name: str) -> None:
    """A dev split must be evaluable and apart from the train split: a carved one needs a train split to carve
    from, a layout whose splits have query ids (not DPR's positions), and a name no other split has."""
    dev = dev_split_of(dataset)
    if dev is None:
        return
    key = f"config key datasets.{name}.dev_split"
    if dev.name == dataset.get("train_split"):
        raise ConfigError(f"{key}: {dev.name!r} is the train split, so settings would be chosen on the queries "
                          "the models train on. Fix: name another split, or carve one: dev_split: {fraction: 0.1}")
    if not dev.carved:
        if dataset.get("train_split") is None and dev.name not in dataset["eval_splits"]:
            raise ConfigError(f"{key}: {dev.name!r} is not one of the eval_splits {dataset['eval_splits']} of this "
                              "evaluation-only dataset. Fix: add it to eval_splits")
        return
    if dataset.get("train_split") is None:
        raise ConfigError(f"{key}: a carved dev split is taken from the train split, and the dataset has none. "
                          f"Fix: set datasets.{name}.train_split, or name an existing split (dev_split: <split>)")
    if reader_of(raw_layout(dataset)).question_files:
        raise ConfigError(f"{key}: DPR question files identify questions by their position, so a carve could "
                          "not be told apart from the train split by id. Fix: name an existing split of the "
                          "collection (dev_split: <split>) with its own question file")
    if dev.name in dataset["eval_splits"]:
        raise ConfigError(f"{key}: the carved split is named {dev.name!r}, which is already one of the "
                          f"eval_splits {dataset['eval_splits']} (a split of the collection). Fix: give the carve "
                          "another name (dev_split: {name: heldout, ...}) or use that split (dev_split: "
                          f"{dev.name})")


def check_fusion(config: dict, name: str) -> None:
    """``reranker.fusion_weight: dev`` needs a dev split judged by qrels, and a metric ir-measures knows."""
    params, dataset = stage_params(config, name, "reranker"), config["datasets"][name]
    if weight_setting(params["fusion_weight"], name)["choice"] is None:  # a number: nothing is chosen on dev
        return
    key = f"config key datasets.{name}.stages.reranker.fusion_weight"
    if dev_split_of(dataset) is None:
        raise ConfigError(f"{key}: `dev` chooses the weight on the dataset's dev split, and it has none. Fix: set "
                          f"datasets.{name}.dev_split (e.g. {{fraction: 0.1}}) or give the weight as a number "
                          "(1 = the re-ranker alone)")
    if dataset.get("relevance") == "answers":
        raise ConfigError(f"{key}: `dev` is chosen against qrels, and this dataset judges by answers. Fix: give "
                          "the weight as a number (1 = the re-ranker alone)")
    try:
        parse_metric(params["fusion_metric"])
    except ValueError as err:
        raise ConfigError(f"config key datasets.{name}.stages.reranker.fusion_metric: {err}") from None


def check_selection_metric(config: dict, name: str) -> None:
    """``selection.metric`` is a metric ir-measures knows (the dev choice of every trained bi-encoder reads it)."""
    try:
        parse_metric(stage_params(config, name, "selection")["metric"])
    except ValueError as err:
        raise ConfigError(f"config key datasets.{name}.stages.selection.metric: {err}") from None


def add_dev_splits(config: dict) -> dict:
    """Every dataset's dev split evaluated like its eval_splits: put first in ``eval_splits`` (summaries show it
    first). Called once, after :func:`check_config_values` (which refuses a carve named like an eval split)."""
    for dataset in config["datasets"].values():
        dev = dev_split_of(dataset)
        if dev is None:
            continue
        if dev.name not in dataset["eval_splits"]:
            dataset["eval_splits"] = [dev.name] + list(dataset["eval_splits"])
    return config


def unshare_datasets(config: dict) -> None:
    """Each dataset its own copy of its blocks, in place: YAML aliases (``stages: {<<: *scifact_stages}``) make
    two datasets hold the same block object, and a change to one dataset's setting would change the other's."""
    datasets = config.get("datasets")
    if isinstance(datasets, dict):
        for name, dataset in datasets.items():
            datasets[name] = copy.deepcopy(dataset)


def validate_config(config: dict, schema_path: str | Path = SCHEMA_PATH) -> dict:
    """Validate ``config`` in place with Snakemake's validator (defaults filled in) and return it."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    if not isinstance(config, dict):
        raise ConfigError(f"the configuration is a {type(config).__name__}, not a mapping of keys "
                          "(datasets, stages, ...); see config.yaml")
    unshare_datasets(config)
    check_moved_settings(config)
    try:
        validate(config, str(schema_path), set_default=True)
    except WorkflowError as err:
        cause = err.__context__
        if not isinstance(cause, jsonschema.ValidationError):
            raise
        raise _schema_error(cause, _path(cause).lstrip(".") or "(the top level)") from None
    schema = yaml.safe_load(Path(schema_path).read_text())
    check_stage_overrides(config, schema)
    fill_denoise_defaults(config, schema)
    check_config_values(config)
    return add_dev_splits(config)


def validate_block(block: object, name: str, schema_path: str | Path = SCHEMA_PATH) -> None:
    """Check ``block`` against the schema of the top-level block ``name`` (``cluster``) alone, defaults not filled
    in: a violation is the ConfigError :func:`validate_config` would raise for it."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator({**schema["properties"][name], "$defs": schema["$defs"]})
    for error in validator.iter_errors(block):
        raise _schema_error(error, f"{name}{_path(error)}")


def read_yaml(path: str | Path) -> object:
    """The YAML of a config file; a missing file, a syntax error or text that is not UTF-8 is a ConfigError naming
    the file (and the line) and the fix."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found; pass an existing YAML file (e.g. config.yaml)")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"{path}{where}: not valid YAML ({problem}); fix the syntax there (indentation, "
                          "brackets, quotes)") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8") from None


def load_config(path: str | Path, schema_path: str | Path = SCHEMA_PATH) -> dict:
    """Read and validate a config file (for use outside Snakemake)."""
    return validate_config(read_yaml(path) or {}, schema_path)

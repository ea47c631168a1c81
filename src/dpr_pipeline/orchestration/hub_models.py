"""The Hugging Face Hub models a config names: each dataset's (one fetch rule each), those its chain loads (what
``fetch_<dataset>`` fetches), those not fetched yet, and with the Hub offline the check that a run's are complete.
Where a Hub name is fetched to: :mod:`dpr_pipeline.models.hub_fetch`."""

from __future__ import annotations

from pathlib import Path

from dpr_pipeline.data.fetch import rule_suffix
from dpr_pipeline.errors import ConfigError
from dpr_pipeline.models.hub_fetch import MANIFEST, fetched_folder, is_fetched
from dpr_pipeline.models.refs import offline_variable
from dpr_pipeline.pretraining.methods import pretraining_method
from dpr_pipeline.orchestration import stage_settings as settings
from dpr_pipeline.orchestration.config import MODEL_SETTINGS, setting_name, stage_params
from dpr_pipeline.stages import BIENCODER, chain, family_member


def named_models(config: dict, dataset: str) -> dict[str, dict]:
    """``{folder: {repo_id, revision}}`` of the Hub names among a dataset's model settings
    (:data:`dpr_pipeline.orchestration.config.MODEL_SETTINGS`, the words they take aside): each has a fetch rule, whose job
    runs when a target needs the model."""
    models = {}
    for (block, key), words in MODEL_SETTINGS.items():
        reference = stage_params(config, dataset, block)[key]
        folder = None if reference in words else fetched_folder(config, reference)
        if folder is not None:
            models[folder] = {"repo_id": reference, "revision": config["fetch"]["revisions"].get(reference)}
    return models


def chain_models(config: dict, dataset: str) -> list[str]:
    """The fetched folders the jobs of a dataset's chain (the default target) load: each bi-encoder's and the
    re-ranker's start, and pre-training's encoder and generator when the chain pre-trains (what ``fetch_<dataset>``
    fetches; the pre-training ablation's models are fetched when a target needs them)."""
    models = [settings.initialisation(config, dataset, stage) for stage in chain(BIENCODER)]
    models.append(settings.reranker(config, dataset)["plm"])
    for stage in settings.pretraining_in_chain(config, dataset):
        pretrain = settings.pretrain(config, dataset, family_member(stage)[1])
        start = settings.pretraining_start(config, dataset)  # its plm, where the start is drawn from one
        models += [pretrain["plm"] if start is None else start["plm"]]
        models += [pretrain["generator"]] if pretraining_method(pretrain["method"]).generator else []
    return [model for model in dict.fromkeys(models) if is_fetched(config, model)]


def missing_models(config: dict) -> dict[str, dict]:
    """The :func:`named_models` of every dataset whose folder has no manifest, each once with the first dataset
    naming it (``dataset``: whose ``resources.fetch`` its job gets): the only ones that get a fetch job (a
    complete folder has no producer, so Snakemake never fetches it again, as fetch.missing_downloads)."""
    missing: dict[str, dict] = {}
    for name in config["datasets"]:
        for folder, spec in named_models(config, name).items():
            if not (Path(folder) / MANIFEST).is_file():
                missing.setdefault(folder, {**spec, "dataset": name})
    return missing


def check_offline_fetches(config: dict) -> None:
    """With the Hub offline here (``HF_HUB_OFFLINE``), the folder of every Hub model a ``run_datasets`` chain loads
    must already be complete, since its fetch job could not download it (another target's model: its fetch job
    says so, at once); a ConfigError names the first setting that names one. Online, nothing to check."""
    variable = offline_variable()
    if variable is None:
        return
    for name in config.get("run_datasets", []):
        needed = chain_models(config, name)
        for (block, key), words in MODEL_SETTINGS.items():
            reference = stage_params(config, name, block)[key]
            folder = None if reference in words else fetched_folder(config, reference)
            if folder is None or folder not in needed or (Path(folder) / MANIFEST).is_file():
                continue
            raise ConfigError(
                f"config key {setting_name(config, name, block, key)}: {reference}: a Hugging Face Hub name, not "
                f"fetched yet (no complete folder {folder}), and {variable} is set (offline), so its fetch job cannot "
                f"download it. Fix: fetch it where the Hub is reachable, without {variable} and with the same "
                f"fetch.models (`snakemake --cores 1 {folder}`; `fetch_{rule_suffix(name)}` fetches all the dataset "
                "needs), or save the model into a folder and point the setting at it")

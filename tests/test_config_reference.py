"""docs/configuration.md is generated from schemas/config.schema.yaml by scripts/config_reference.py; the committed
page must be what the script writes today, and it must show the defaults the workflow really fills in."""
from __future__ import annotations

import importlib.util

import pytest
from conftest import REPO

spec = importlib.util.spec_from_file_location("config_reference", REPO / "scripts" / "config_reference.py")
config_reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(config_reference)


def test_committed_configuration_page_is_current():
    expected = config_reference.render(config_reference.load_schema())
    committed = config_reference.OUTPUT.read_text(encoding="utf-8")
    if committed != expected:
        pytest.fail(f"docs/configuration.md is out of date with schemas/config.schema.yaml; regenerate it with: "
                    f"{config_reference.COMMAND}, and commit the result")


def test_check_mode_names_the_command_when_the_page_is_stale(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "configuration.md"
    stale.write_text("# an old page\n")
    monkeypatch.setattr(config_reference, "OUTPUT", stale)
    monkeypatch.setattr(config_reference, "REPO", tmp_path)
    monkeypatch.setattr(config_reference, "SCHEMA", tmp_path / "config.schema.yaml")
    (tmp_path / "config.schema.yaml").write_text((REPO / "schemas" / "config.schema.yaml").read_text())
    assert config_reference.main(["--check"]) == 1
    assert "make docs" in capsys.readouterr().err
    assert config_reference.main([]) == 0
    assert config_reference.main(["--check"]) == 0


def _rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_every_stage_setting_is_listed_with_the_default_validation_fills_in():
    """The page's defaults are the ones the workflow uses: a minimal config, validated, gets exactly them for every
    stage key (the shared training/bi-encoder fragments merged under each block, each block's own default)."""
    from dpr_pipeline.orchestration.config import validate_config

    config = validate_config({"datasets": {"scifact": {"format": "beir", "path": "data/scifact", "eval_splits": ["test"]}}})
    rows = _rows(config_reference.render(config_reference.load_schema()))

    def check(prefix: str, values: dict):
        for key, value in values.items():
            path = f"{prefix}.{key}"
            if isinstance(value, dict):
                check(path, value)
                continue
            # a key a block only inherits is listed once, in its shared fragment's section (`<stage>` for the block)
            parts = path.split(".")
            listed = [path] + [".".join(parts[:i] + ["<stage>"] + parts[i + 1:]) for i in range(1, len(parts) - 1)]
            found = [p for p in listed if p in rows]
            assert found, f"{path} is not on the page"
            assert rows[found[0]][1] == config_reference.code(value), (found[0], rows[found[0]][1], value)

    for block in ("stages", "evaluation", "transfer", "fetch"):
        check(block, config[block])
    assert rows["run_datasets"][1] == config_reference.code(config["run_datasets"])
    # settings without a default are listed too, as unset or required
    assert rows["stages.<stage>.train_steps"][1] == "—"
    assert rows["datasets.<name>.format"][1] == "required"


def test_fragments_merge_and_a_definition_used_twice_is_listed_once():
    schema = {
        "type": "object",
        "properties": {
            "stages": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}},
            "resources": {"type": "object", "additionalProperties": {"$ref": "#/$defs/res"}},
            "datasets": {"type": "object", "additionalProperties": {"type": "object", "properties": {
                "resources": {"type": "object", "additionalProperties": {"$ref": "#/$defs/res"}}}}},
        },
        "$defs": {
            "loop": {"type": "object", "properties": {
                "lr": {"type": "number", "minimum": 0, "description": "shared"},
                "steps": {"type": "integer", "default": 5}}},
            "a": {"allOf": [{"$ref": "#/$defs/loop"}], "description": "block a",
                  "properties": {"lr": {"default": 0.5, "minimum": 0.1}, "own": {"enum": ["x", "y"]}}},
            "res": {"type": "object", "properties": {"mem_mb": {"type": "integer", "description": "memory"}}},
        },
    }
    text = config_reference.render(schema)
    rows = _rows(text)
    assert rows["stages.a.lr"] == ["number", "`0.5`", "≥ 0.1", "shared"]
    assert rows["stages.a.steps"][1] == "`5`"
    assert rows["stages.a.own"][:3] == ["string", "—", "`x`, `y`"]
    assert rows["resources.<rule>.mem_mb"][3] == "memory"
    assert "datasets.<name>.resources.<rule>.mem_mb" not in rows
    assert "Same keys as `resources.<rule>`" in rows["datasets.<name>.resources.<rule>"][3]
    assert "## `stages.a`\n\nblock a\n" in text


def test_a_fragment_two_blocks_build_on_is_listed_once():
    schema = {
        "type": "object",
        "properties": {"stages": {"type": "object", "properties": {
            "a": {"allOf": [{"$ref": "#/$defs/loop"}], "properties": {"lr": {"default": 0.5}, "own": {"type": "integer"}}},
            "b": {"allOf": [{"$ref": "#/$defs/loop"}], "properties": {"lr": {"default": 0.1}}}}}},
        "$defs": {"loop": {"type": "object", "description": "the loop", "properties": {
            "lr": {"type": "number", "description": "shared"},
            "steps": {"type": "integer", "default": 5, "description": "steps"}}}},
    }
    text = config_reference.render(schema)
    rows = _rows(text)
    assert rows["stages.<stage>.steps"][1] == "`5`" and rows["stages.<stage>.lr"][3] == "shared"
    assert "stages.a.steps" not in rows and "stages.b.steps" not in rows
    assert rows["stages.a.lr"][1] == "`0.5`" and rows["stages.b.lr"][1] == "`0.1`"
    assert rows["stages.a.own"][0] == "integer"
    assert "## `stages.<stage>` (loop)\n\nthe loop\n" in text
    assert "Also the settings of [loop](#stagesstage-loop)" in text

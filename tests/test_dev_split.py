"""The dev split a dataset carves from its train queries: deterministic, disjoint from train, recorded."""

import copy
import random

import pytest
from conftest import write_beir

from dpr_pipeline.data.dev_split import DevSplit, carve_of, carved_query_ids, dev_split_of, source_split
from dpr_pipeline.data.fetch import dataset_splits
from dpr_pipeline.data.ingest import ingest_corpus, ingest_split, read_ingestion_counts
from dpr_pipeline.data.schemas import read_artifact
from dpr_pipeline.errors import ConfigError
from dpr_pipeline.orchestration.config import validate_config

IDS = [f"q{i}" for i in range(100)]
TEXTS = [f"claim number {i}" for i in range(100)]


def test_the_carve_is_seeded_sized_and_independent_of_input_order():
    dev = DevSplit(name="dev", source="train", fraction=0.1, seed=7)
    chosen = carved_query_ids(IDS, TEXTS, dev)
    assert len(chosen) == 10
    shuffled = list(zip(IDS, TEXTS))
    random.Random(0).shuffle(shuffled)
    assert carved_query_ids([i for i, _ in shuffled], [t for _, t in shuffled], dev) == chosen
    assert carved_query_ids(IDS, TEXTS, DevSplit(name="dev", source="train", fraction=0.1, seed=8)) != chosen
    assert len(carved_query_ids(IDS, TEXTS, DevSplit(name="dev", source="train", count=33))) == 33


def test_identical_texts_fall_on_one_side_and_train_is_never_emptied():
    texts = ["same claim"] * 50 + TEXTS[50:]
    for seed in range(20):
        chosen = carved_query_ids(IDS, texts, DevSplit(name="dev", source="train", fraction=0.3, seed=seed))
        same = {q for q, t in zip(IDS, texts) if t == "same claim"}
        assert same <= chosen or not same & chosen
    assert len(carved_query_ids(["a", "b"], ["x", "y"], DevSplit(name="dev", source="train", fraction=0.99))) == 1
    with pytest.raises(ValueError, match="too few"):
        carved_query_ids(["a", "b"], ["x", " x "], DevSplit(name="dev", source="train", count=1))


def _ingest(root, tmp_path, split, carve, train_queries=None, evaluation=False):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    if not (out / "corpus.parquet").exists():
        ingest_corpus("beir", root, out / "corpus.parquet")
    name = carve["name"] if carve["side"] == "dev" else split
    ingest_split("beir", root, split, out / "corpus.parquet", out / f"queries_{name}.parquet",
                 out / f"qrels_{name}.parquet", carve=carve, train_queries=train_queries, evaluation=evaluation)
    return out / f"queries_{name}.parquet", out / f"qrels_{name}.parquet"


def test_ingestion_writes_two_disjoint_sides_that_together_are_the_train_split(tmp_path):
    docs = [(f"d{i}", "", f"passage {i}") for i in range(30)]
    queries = [(f"q{i}", f"question {i}") for i in range(30)]
    root = write_beir(tmp_path / "raw", docs=docs, queries=queries,
                      qrels={"train": [(f"q{i}", f"d{i}", 1) for i in range(30)]})
    dataset = {"format": "beir", "path": str(root), "train_split": "train", "eval_splits": ["test"],
               "dev_split": {"fraction": 0.2, "seed": 3}}
    train_queries, train_qrels = _ingest(root, tmp_path, "train", carve_of(dataset, "train"))
    dev_queries, dev_qrels = _ingest(root, tmp_path, source_split(dataset, "dev"), carve_of(dataset, "dev"),
                                     train_queries=train_queries, evaluation=True)  # the leakage check runs
    train_ids = set(read_artifact(train_queries, "queries")["query_id"])
    dev_ids = set(read_artifact(dev_queries, "queries")["query_id"])
    assert len(dev_ids) == 6 and len(train_ids) == 24
    assert not train_ids & dev_ids and train_ids | dev_ids == {q for q, _ in queries}
    assert set(read_artifact(dev_qrels, "qrels")["query_id"]) == dev_ids
    recorded = read_ingestion_counts(dev_qrels)["dev_split"]
    assert recorded == {"side": "dev", "name": "dev", "carved_from": "train", "fraction": 0.2, "count": None,
                        "seed": 3}
    assert read_ingestion_counts(train_qrels)["dev_split"]["side"] == "train"


CONFIG = {"run_datasets": ["a"], "datasets": {"a": {"format": "beir", "path": "data/scifact", "train_split": "train",
                             "eval_splits": ["test"], "dev_split": {"fraction": 0.1}}}}


def test_a_carved_dev_split_is_evaluated_first_and_not_fetched():
    config = validate_config(copy.deepcopy(CONFIG))
    dataset = config["datasets"]["a"]
    assert dataset["eval_splits"] == ["dev", "test"]
    assert dev_split_of(dataset) == DevSplit(name="dev", source="train", fraction=0.1)
    assert carve_of(dataset, "test") is None and source_split(dataset, "dev") == "train"
    assert dataset_splits(dataset) == ["train", "test"]


def test_an_existing_split_as_dev_split_is_read_from_its_own_files():
    config = copy.deepcopy(CONFIG)
    config["datasets"]["a"].update(dev_split="dev", eval_splits=["test"])
    dataset = validate_config(config)["datasets"]["a"]
    assert dataset["eval_splits"] == ["dev", "test"] and source_split(dataset, "dev") == "dev"
    assert carve_of(dataset, "dev") is None and dataset_splits(dataset) == ["train", "dev", "test"]


@pytest.mark.parametrize("edit, message", [
    ({"dev_split": "train"}, "'train' is the train split"),
    ({"dev_split": {"fraction": 0.1, "name": "test"}}, "already one of the eval_splits"),
    ({"format": "dpr", "dev_split": {"count": 10}}, "DPR question files identify questions by their position"),
    ({"dev_split": {"fraction": 0.1, "count": 3}}, "config key datasets.a.dev_split"),
    ({"dev_split": {"fraction": 1.5}}, "config key datasets.a.dev_split"),
])
def test_a_dev_split_that_cannot_work_stops_at_start_up(edit, message):
    config = copy.deepcopy(CONFIG)
    config["datasets"]["a"].update(edit)
    with pytest.raises(ConfigError, match=message):
        validate_config(config)


def test_a_carve_needs_a_train_split():
    config = copy.deepcopy(CONFIG)
    del config["datasets"]["a"]["train_split"]
    with pytest.raises(ConfigError, match="has none"):
        validate_config(config)

"""Zero-shot transfer and evaluation-only datasets: the id-dropping evaluation (BEIR's ignore_identical_ids), the
train-split check, the transfer config checks, the transfer summary table, and the workflow's plan and BM25 on
the evaluation-only fixture tests/data/arguana_mini (the whole SciFact transfer runs in tests/test_workflow.py)."""

import copy
import json
import math

import pandas as pd
import pytest
import yaml
from conftest import REPO, config_block, planned_jobs, run_snakemake

from dpr_pipeline.data.schemas import write_artifact
from dpr_pipeline.data.trec_runs import write_trec_run
from dpr_pipeline.errors import ConfigError, DataError
from dpr_pipeline.evaluation.metrics import drop_identical_ids, evaluate_splits
from dpr_pipeline.evaluation.transfer_summary import check_transfer_leakage, used_lengths, write_transfer_summary
from dpr_pipeline.models.refs import max_seq_length
from dpr_pipeline.retrieval.encode import resolved_length
from dpr_pipeline.orchestration.config import train_split_of, validate_config

ARGUANA_MINI = REPO / "tests" / "data" / "arguana_mini"
BUNDLED = yaml.safe_load((REPO / "config.yaml").read_text())


# -- dropping hits whose doc id is the query id -------------------------------------------------------------------

def test_drop_identical_ids_keeps_every_other_hit_in_order():
    run = pd.DataFrame([("a", "a", 1, 9.0), ("a", "b", 2, 8.0), ("a", "c", 3, 7.0), ("b", "a", 1, 5.0),
                        ("b", "b", 2, 4.0)], columns=["query_id", "doc_id", "rank", "score"])
    kept = drop_identical_ids(run)
    assert list(zip(kept["query_id"], kept["doc_id"])) == [("a", "b"), ("a", "c"), ("b", "a")]


def test_evaluation_with_ignore_identical_ids_moves_the_answer_up(tmp_path):
    # ArguAna's case: each query retrieves itself first, its counter-argument second.
    write_trec_run([("q1", [("q1", 9.0), ("d1", 8.0), ("x", 7.0)]), ("q2", [("q2", 9.0), ("x", 8.0), ("d2", 7.0)])],
                   tmp_path / "run.trec", "test")
    qrels = pd.DataFrame([("q1", "d1", 1), ("q2", "d2", 1)], columns=["query_id", "doc_id", "relevance"])
    write_artifact(qrels, tmp_path / "qrels.parquet", "qrels")
    args = ([str(tmp_path / "run.trec")], [str(tmp_path / "qrels.parquet")], ["test"], ["MRR@10", "nDCG@10"])
    kept = evaluate_splits(*args, str(tmp_path / "kept.json"))["test"]
    dropped = evaluate_splits(*args, str(tmp_path / "dropped.json"), ignore_identical_ids=True)["test"]
    assert kept["MRR@10"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert dropped["MRR@10"] == pytest.approx((1 + 1 / 2) / 2)
    assert dropped["nDCG@10"] == pytest.approx((1 + 1 / math.log2(3)) / 2)
    assert json.loads((tmp_path / "dropped.json").read_text())["test"] == dropped


# -- evaluation-only datasets and the transfer configuration -------------------------------------------------------

def config_with_arguana(**transfer_to):
    config = copy.deepcopy(BUNDLED)
    config["datasets"]["arguana_mini"] = {"format": "beir", "path": str(ARGUANA_MINI), "eval_splits": ["test"],
                                          "ignore_identical_ids": True}
    for dataset, targets in transfer_to.items():
        config["datasets"][dataset]["transfer_to"] = targets
    return config


def test_an_evaluation_only_dataset_validates_and_has_no_train_split():
    config = validate_config(config_with_arguana(scifact=["arguana_mini", "msmarco"]))
    assert train_split_of(config, "scifact") == "train"
    assert config["datasets"]["scifact"]["ignore_identical_ids"] is False          # the default
    assert config["transfer"] == {"stages": ["start", "retriever1", "retriever2", "reranker", "distill"],
                                  "metric": "nDCG@10", "rerank_depth": 100}
    with pytest.raises(ConfigError, match=r"dataset 'arguana_mini' has no train split .* so Retriever1 cannot run"):
        train_split_of(config, "arguana_mini", "Retriever1")


@pytest.mark.parametrize("change, message", [
    (lambda c: c["datasets"]["scifact"].update(transfer_to=["no_such_collection"]),
     r"datasets.scifact.transfer_to names undeclared dataset\(s\) \['no_such_collection'\]"),
    (lambda c: c["datasets"]["scifact"].update(transfer_to=["scifact"]), r"transfer_to names 'scifact' itself"),
    (lambda c: c["datasets"]["arguana_mini"].update(transfer_to=["scifact"]),
     r"datasets.arguana_mini.transfer_to: dataset 'arguana_mini' has no train_split"),
    (lambda c: c.update(transfer={"metric": "nDCG@20"}), r"transfer.metric: 'nDCG@20' is not one of"),
    (lambda c: c.update(transfer={"stages": ["bm25"]}), r"config key transfer.stages\[0\]"),
    (lambda c: config_block(c, "stages", "bm25").update(remove_query_id_hits=True), r"'remove_query_id_hits' was unexpected"),
])
def test_bad_transfer_configuration_is_rejected_by_name(change, message):
    config = config_with_arguana()
    change(config)
    with pytest.raises(ConfigError, match=message):
        validate_config(config)


# -- the transfer summary ------------------------------------------------------------------------------------------

def write_metrics(path, values_by_split):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({split: {"num_queries": n, "nDCG@10": v, "R@100": v / 2}
                                for split, (n, v) in values_by_split.items()}))
    return path


def test_transfer_summary_has_a_row_per_collection_and_split_and_the_average(tmp_path):
    paths = {
        "arguana": {"bm25": write_metrics(tmp_path / "a_bm25.json", {"test": (10, 0.40)}),
                    "retriever1": write_metrics(tmp_path / "a_r1.json", {"test": (10, 0.30)}),
                    "reranker": write_metrics(tmp_path / "a_rr.json", {"test": (10, 0.50)})},
        "msmarco": {"bm25": write_metrics(tmp_path / "m_bm25.json", {"dev": (7, 0.20), "dl19": (4, 0.60)}),
                    "retriever1": write_metrics(tmp_path / "m_r1.json", {"dev": (7, 0.10), "dl19": (4, 0.30)}),
                    "reranker": write_metrics(tmp_path / "m_rr.json", {"dev": (7, 0.25), "dl19": (4, 0.65)})},
    }
    out = [tmp_path / "transfer_summary.json", tmp_path / "transfer_summary.md", tmp_path / "transfer_summary.png"]
    summary = write_transfer_summary("scifact", paths, "nDCG@10", *out)
    assert summary["columns"] == ["bm25", "retriever1", "reranker"]
    assert summary["rows"] == {"arguana": {"bm25": 0.40, "retriever1": 0.30, "reranker": 0.50},
                               "msmarco (dev)": {"bm25": 0.20, "retriever1": 0.10, "reranker": 0.25},
                               "msmarco (dl19)": {"bm25": 0.60, "retriever1": 0.30, "reranker": 0.65}}
    assert summary["average"] == pytest.approx({"bm25": 0.40, "retriever1": 0.70 / 3, "reranker": 1.40 / 3})
    assert summary["collections"]["msmarco"]["dl19"]["reranker"]["R@100"] == pytest.approx(0.325)  # detail kept
    assert json.loads(out[0].read_text()) == json.loads(json.dumps(summary))
    lines = out[1].read_text().splitlines()
    assert lines[0] == "# Zero-shot transfer of scifact's models (nDCG@10)"
    table = lines[lines.index("| collection | BM25 | Retriever₁ | Re-ranker |"):]
    assert table[2:] == ["| arguana (10 queries) | 0.4000 | 0.3000 | 0.5000 |",
                         "| msmarco (dev) (7 queries) | 0.2000 | 0.1000 | 0.2500 |",
                         "| msmarco (dl19) (4 queries) | 0.6000 | 0.3000 | 0.6500 |",
                         "| **Average** | 0.4000 | 0.2333 | 0.4667 |"]
    assert out[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_summary_names_the_lengths_each_model_encoded_each_collection_at(tmp_path, tiny_bert):
    """Issue 52: a target's texts are encoded at its declared transfer_max_length, else at the model's own
    max_seq_length, read from its folder as the encoding jobs read it; the summary's JSON and Markdown say which."""
    from sentence_transformers import SentenceTransformer

    # the length sentence-transformers gives the folder (it records it as the tokenizer's model_max_length)
    assert max_seq_length(str(tiny_bert)) == SentenceTransformer(str(tiny_bert), device="cpu").max_seq_length == 64
    assert resolved_length(str(tiny_bert), None, "queries") == 64
    assert resolved_length(str(tiny_bert), 32, "queries") == 32
    lengths = used_lengths({"arguana": {"query": None, "passage": None}, "fiqa": {"query": 48, "passage": None}},
                           {"retriever1": str(tiny_bert)}, reranker_max_length=192)
    assert lengths == {"arguana": {"retriever1": {"query": 64, "passage": 64}, "reranker": {"pair": 192}},
                       "fiqa": {"retriever1": {"query": 48, "passage": 64}, "reranker": {"pair": 192}}}
    paths = {target: {"bm25": write_metrics(tmp_path / f"{target}_bm25.json", {"test": (10, 0.40)}),
                      "retriever1": write_metrics(tmp_path / f"{target}_r1.json", {"test": (10, 0.30)}),
                      "reranker": write_metrics(tmp_path / f"{target}_rr.json", {"test": (10, 0.50)})}
             for target in ("arguana", "fiqa")}
    out = [tmp_path / "s.json", tmp_path / "s.md", tmp_path / "s.png"]
    summary = write_transfer_summary("scifact", paths, "nDCG@10", *out, lengths=lengths)
    assert json.loads(out[0].read_text())["lengths"] == summary["lengths"] == lengths
    lines = out[1].read_text().splitlines()
    table = lines[lines.index("| collection | Retriever₁ | Re-ranker |"):]
    assert table[2:] == ["| arguana | 64 / 64 | 192 |", "| fiqa | 48 / 64 | 192 |"]
    folder = tmp_path / "no_lengths"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with pytest.raises(DataError, match="records no maximum length.*Fix: set the target dataset's transfer_max_length"):
        max_seq_length(str(folder))


def test_transfer_summary_names_a_metrics_file_without_the_metric(tmp_path):
    paths = {"arguana": {"bm25": write_metrics(tmp_path / "bm25.json", {"test": (10, 0.4)}),
                         "retriever1": tmp_path / "r1.json"}}
    paths["arguana"]["retriever1"].write_text(json.dumps({"test": {"num_queries": 10, "MRR@10": 0.2}}))
    with pytest.raises(DataError, match=r"r1.json.*has no 'nDCG@10'"):
        write_transfer_summary("scifact", paths, "nDCG@10", tmp_path / "s.json", tmp_path / "s.md", tmp_path / "s.png")
    assert not (tmp_path / "s.json").exists()


def test_transfer_refuses_evaluation_queries_the_source_trained_on_unless_allowed(tmp_path, caplog):
    train, test = tmp_path / "a_queries_train.parquet", tmp_path / "b_queries_test.parquet"
    write_artifact(pd.DataFrame({"query_id": ["1", "2"], "text": ["Do cats purr?", "Dogs  bark loudly"]}), train,
                   "queries")
    write_artifact(pd.DataFrame({"query_id": ["x", "y", "z"], "text": ["birds", "dogs bark  loudly", "Do cats purr?"]}),
                   test, "queries")
    with pytest.raises(DataError) as error:
        check_transfer_leakage(train, {"test": test}, tmp_path / "leakage.json")
    message = str(error.value)       # identical text (case kept, whitespace collapsed): z only; ids mean nothing
    assert message.startswith(f"{test}, row 3: 1 of the 3 queries of evaluation split 'test' are also train queries "
                              f"({train}): 1 by identical text (first 'z', the train query '1'")
    assert not (tmp_path / "leakage.json").exists()
    assert check_transfer_leakage(train, {"test": test}, tmp_path / "leakage.json", allow_overlap=["z"]) == {"test": 1}
    assert json.loads((tmp_path / "leakage.json").read_text()) == {"test": 1}
    assert "kept because allow_overlap lists them" in caplog.text
    assert check_transfer_leakage(None, {"test": test}, tmp_path / "none.json") == {"test": 0}


# -- the workflow on the evaluation-only fixture ------------------------------------------------------------------

def snakemake(workdir, *args):
    return run_snakemake(workdir, *args)


@pytest.fixture
def workdir(tmp_path):
    config = config_with_arguana(scifact=["arguana_mini"])
    config["datasets"]["scifact"]["path"] = str(REPO / "data" / "scifact")
    config["datasets"]["arguana_mini"]["stages"] = {"bm25": {"depth": 5, "threads": 1}}
    # the same collection without BEIR's id dropping, to compare
    config["datasets"]["arguana_kept"] = {**config["datasets"]["arguana_mini"], "ignore_identical_ids": False}
    config["run_datasets"] = ["arguana_mini"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


@pytest.mark.slow
def test_training_on_an_evaluation_only_dataset_fails_naming_the_dataset_and_the_split(workdir):
    done = snakemake(workdir, "-n", "results/arguana_mini/retriever1/metrics.json")
    assert done.returncode != 0
    assert ("dataset 'arguana_mini' has no train split (datasets.arguana_mini.train_split is not set: it is "
            "evaluation-only), so the training job (stage=retriever1) cannot run on it") in done.stdout + done.stderr


@pytest.mark.slow
def test_dry_run_plans_bm25_for_an_evaluation_only_dataset_and_the_transfer(workdir):
    done = snakemake(workdir, "-n")        # run_datasets: [arguana_mini] -> its BM25 evaluation only
    assert done.returncode == 0, done.stderr[-3000:]
    assert planned_jobs(done.stdout) == {"ingest_corpus": 1, "ingest_split": 1, "bm25_index": 1, "bm25_search": 1,
                                         "evaluate": 1, "plot_metrics": 1, "all": 1}
    done = snakemake(workdir, "-n", "results/scifact/transfer_summary.md")
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = planned_jobs(done.stdout)
    # the starting model and 3 bi-encoders x (1 encoding shard + index + search of the test split); the
    # re-ranker on BM25's run
    assert {rule: jobs[rule] for rule in jobs if rule.startswith("transfer")} == {
        "transfer_encode_corpus": 4, "transfer_build_index": 4, "transfer_dense_search": 4, "transfer_rerank": 1,
        "transfer_evaluate": 5, "transfer_summary": 1, "transfer_leakage": 1}
    leakage = done.stdout[done.stdout.index("rule transfer_leakage:"):].split("\n\n")[0]
    assert "results/scifact/data/queries_train.parquet" in leakage            # A's train queries
    assert "results/arguana_mini/data/queries_test.parquet" in leakage        # B's evaluation queries


@pytest.mark.slow
def test_bm25_on_the_evaluation_only_fixture_drops_each_query_itself(workdir):
    done = snakemake(workdir, "results/arguana_mini/bm25/metrics.json", "results/arguana_kept/bm25/metrics.json")
    assert done.returncode == 0, done.stderr[-4000:]
    results = workdir / "results"
    dropped = json.loads((results / "arguana_mini" / "bm25" / "metrics.json").read_text())["test"]
    kept = json.loads((results / "arguana_kept" / "bm25" / "metrics.json").read_text())["test"]
    assert dropped["num_queries"] == kept["num_queries"] == 10
    run = pd.read_csv(results / "arguana_kept" / "bm25" / "run_test.trec", sep=" ", header=None,
                      names=["query_id", "q0", "doc_id", "rank", "score", "tag"])
    top = run[run["rank"] == 1]
    assert (top["query_id"] == top["doc_id"]).all()       # each argument finds itself first
    run = pd.read_csv(results / "arguana_mini" / "bm25" / "run_test.trec", sep=" ", header=None,
                      names=["query_id", "q0", "doc_id", "rank", "score", "tag"])
    assert not (run["query_id"] == run["doc_id"]).any()
    assert run.groupby("query_id").size().eq(5).all()     # still `depth` hits per query
    assert dropped["MRR@10"] > kept["MRR@10"] and dropped["nDCG@10"] > kept["nDCG@10"]
    assert kept["MRR@10"] <= 0.5                          # the answer is at rank 2 at best when the query is kept

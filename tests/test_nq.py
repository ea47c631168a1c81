"""Natural Questions in DPR's formats (tests/data/nq: psgs_w100.tsv, biencoder-nq-train.json, nq-test.qa.csv):
ingestion and its errors, top-k retrieval accuracy by answer containment, answer-filtered mining, the `nq`
config's paper settings, and the whole chain through `snakemake` from the raw files to R@20/R@100."""

import json
import shutil

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import REPO, copy_repo, make_tiny_bert, planned_jobs, run_snakemake, slurm_dry_run

from dpr_pipeline.data.answers import has_answer
from dpr_pipeline.data.ingest import ingest_answers, ingest_corpus, ingest_official_negatives, ingest_split
from dpr_pipeline.data.schemas import read_artifact
from dpr_pipeline.data.trec_runs import write_trec_run
from dpr_pipeline.errors import DataError
from dpr_pipeline.evaluation.metrics import answer_accuracy, evaluate_answer_splits
from dpr_pipeline.retrieval.negatives import mine_hard_negatives
from dpr_pipeline.orchestration.config import stage_params, validate_config

FIXTURE = REPO / "tests" / "data" / "nq"
NQ = yaml.safe_load((REPO / "config.yaml").read_text())["datasets"]["nq"]
TRAIN = {"queries": "biencoder-nq-train.json"}
TEST = {"queries": "nq-test.qa.csv"}


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    out = tmp_path_factory.mktemp("nq")
    ingest_corpus("dpr", FIXTURE, out / "corpus.parquet")
    ingest_split("dpr", FIXTURE, "train", out / "corpus.parquet", out / "q_train.parquet", out / "r_train.parquet",
                 files=TRAIN)
    ingest_split("dpr", FIXTURE, "test", out / "corpus.parquet", out / "q_test.parquet", out / "r_test.parquet",
                 files=TEST)
    ingest_answers(FIXTURE, "train", out / "a_train.parquet", files=TRAIN)
    ingest_answers(FIXTURE, "test", out / "a_test.parquet", files=TEST)
    return out


def test_fixture_ingests_in_dpr_formats(ingested, tmp_path):
    corpus = read_artifact(ingested / "corpus.parquet", "corpus")
    assert len(corpus) == 60 and corpus["doc_id"].tolist()[:3] == ["1", "2", "3"]
    # csv-quoted text with doubled quotes (as psgs_w100.tsv has them) comes back unquoted
    assert 'call the stretch through town "the slow water", and' in corpus.loc[1, "text"]
    assert corpus.loc[0, "title"] == "Varnel"
    train_queries = read_artifact(ingested / "q_train.parquet", "queries")
    assert train_queries["query_id"].tolist() == [str(i) for i in range(24)]       # position in the file
    qrels = read_artifact(ingested / "r_train.parquet", "qrels")
    assert len(qrels) == 24 and set(qrels["relevance"]) == {1}                       # passage_id and psg_id
    # the test split: every question is a query, no judgements (relevance is by answers)
    assert len(read_artifact(ingested / "q_test.parquet", "queries")) == 10
    assert len(read_artifact(ingested / "r_test.parquet", "qrels")) == 0
    answers = read_artifact(ingested / "a_test.parquet", "answers")
    first_line = (FIXTURE / "nq-test.qa.csv").read_text(encoding="utf-8").splitlines()[0]
    assert answers.loc[0, "answers"].tolist() == eval(first_line.split("\t")[1])  # noqa: S307 (our own fixture)


def test_official_negatives_are_the_hard_negative_ctxs(ingested, tmp_path):
    output = tmp_path / "official.parquet"
    assert ingest_official_negatives(FIXTURE / "biencoder-nq-train.json", ingested / "r_train.parquet", output) == 24
    negatives = read_artifact(output, "negatives")
    train = json.loads((FIXTURE / "biencoder-nq-train.json").read_text(encoding="utf-8"))
    first = train[0]
    assert negatives.loc[0, "negative_ids"].tolist() == [c["passage_id"] for c in first["hard_negative_ctxs"]]
    assert negatives.loc[0, "positive_ids"].tolist() == [first["positive_ctxs"][0]["passage_id"]]


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


PSGS_OK = "id\ttext\ttitle\n1\tsome text\tA\n"
QUESTION = {"question": "who", "answers": ["Ann"], "positive_ctxs": [{"title": "A", "text": "t", "passage_id": "1"}],
            "hard_negative_ctxs": []}


def test_positive_outside_the_passages_is_an_error_or_a_counted_drop(tmp_path):
    _write(tmp_path / "psgs_w100.tsv", PSGS_OK)
    _write(tmp_path / "train.json", json.dumps([QUESTION, {**QUESTION, "positive_ctxs": [{"passage_id": 9}]}]))
    ingest_corpus("dpr", tmp_path, tmp_path / "corpus.parquet")
    args = ("dpr", tmp_path, "train", tmp_path / "corpus.parquet", tmp_path / "q.parquet", tmp_path / "r.parquet")
    with pytest.raises(DataError, match="doc id '9' is not in the corpus"):
        ingest_split(*args)
    assert ingest_split(*args, unknown_qrels_ids="warn") == (2, 1)


def test_answers_artifact_rejects_a_question_without_answers(tmp_path):
    path = tmp_path / "answers.parquet"
    pd.DataFrame({"query_id": ["0", "1"], "answers": [["a"], []]}).to_parquet(path)
    with pytest.raises(DataError, match="row 2: a question without answers"):
        read_artifact(path, "answers")


def test_top_k_accuracy_by_hand():
    # q1: first answer at rank 3; q2: at rank 6; q3: none; q4: not in the run. Accuracy over all 4 questions.
    run = pd.DataFrame({"query_id": ["q1"] * 4 + ["q2"] * 6 + ["q3"] * 2,
                        "doc_id": [f"d{i}" for i in range(12)],
                        "rank": [1, 2, 3, 4, 1, 2, 3, 4, 5, 6, 1, 2]})
    labels = pd.Series([False, False, True, True] + [False] * 5 + [True] + [False, False])
    values = answer_accuracy(run, labels, ["q1", "q2", "q3", "q4"], ["R@1", "R@3", "Acc@5", "R@20"])
    assert values == {"num_queries": 4, "R@1": 0.0, "R@3": 0.25, "Acc@5": 0.25, "R@20": 0.5}
    with pytest.raises(ValueError, match="use R@k or Acc@k"):
        answer_accuracy(run, labels, ["q1"], ["MRR@10"])


def test_evaluation_of_a_hand_built_run_against_the_fixture(ingested, tmp_path):
    """Test questions 0 and 1 get their answer passage at rank 2 and 21, the rest passages without an answer."""
    corpus = read_artifact(ingested / "corpus.parquet", "corpus")
    answers = read_artifact(ingested / "a_test.parquet", "answers")
    holders = {q: [d for d, t in zip(corpus["doc_id"], corpus["text"]) if has_answer(a, t)]
               for q, a in zip(answers["query_id"], answers["answers"])}
    results = []
    for qid in answers["query_id"]:
        hits = [d for d in corpus["doc_id"] if d not in holders[qid]][:25]
        if qid == "0":
            hits.insert(1, holders[qid][0])
        elif qid == "1":
            hits.insert(20, holders[qid][0])
        results.append((qid, [(d, 100.0 - i) for i, d in enumerate(hits)]))
    write_trec_run(results, tmp_path / "run.trec", "hand")
    metrics = evaluate_answer_splits([str(tmp_path / "run.trec")], [str(ingested / "a_test.parquet")],
                                     str(ingested / "corpus.parquet"), ["test"], ["R@5", "R@20", "R@100"],
                                     str(tmp_path / "metrics.json"))
    assert metrics == {"test": {"num_queries": 10, "R@5": 0.1, "R@20": 0.1, "R@100": 0.2}}
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert list(written.pop("provenance")) == ["manifest", "runs", "answers"]
    per_query = written.pop("per_query")["test"]      # question 0 answered at rank 2, question 1 at rank 21
    assert {name: [q for q, v in values.items() if v] for name, values in per_query.items()} == {
        "R@5": ["0"], "R@20": ["0"], "R@100": ["0", "1"]}
    assert len(per_query["R@5"]) == 10
    assert written == {**metrics, "counts": {"test": {"queries_scored": 10, "queries_without_hits": 0}}}


def test_mined_negatives_leave_out_hits_that_contain_an_answer(tmp_path):
    corpus = tmp_path / "corpus.parquet"
    pd.DataFrame({"doc_id": ["p", "a", "n1", "n2", "deep"], "title": [""] * 5,
                  "text": ["Ann Lee won.", "It was Ann Lee.", "Bob won.", "Annual Leeds fair.", "Carl."]}
                 ).to_parquet(corpus)
    qrels = tmp_path / "qrels.parquet"
    pd.DataFrame({"query_id": ["0"], "doc_id": ["p"], "relevance": [1]}).to_parquet(qrels)
    answers = tmp_path / "answers.parquet"
    pd.DataFrame({"query_id": ["0"], "answers": [["Ann Lee"]]}).to_parquet(answers)
    write_trec_run([("0", [("a", 5.0), ("p", 4.0), ("n1", 3.0), ("n2", 2.0), ("deep", 1.0)])], tmp_path / "r.trec",
                   "t")
    mined = mine_hard_negatives(str(tmp_path / "r.trec"), str(qrels), str(tmp_path / "neg.parquet"), depth=4,
                                keep=10, seed=1, source="retriever1", answers=str(answers), corpus=str(corpus))
    assert mined.loc[0, "negative_ids"] == ["n1", "n2"]       # "a" holds the answer, "deep" is below depth 4
    plain = mine_hard_negatives(str(tmp_path / "r.trec"), str(qrels), str(tmp_path / "neg2.parquet"), depth=4,
                                keep=10, seed=1, source="retriever1")
    assert plain.loc[0, "negative_ids"] == ["a", "n1", "n2"]


def test_nq_config_carries_the_paper_settings():
    config = validate_config(yaml.safe_load((REPO / "config.yaml").read_text()))
    assert config["datasets"]["nq"]["format"] == "dpr" and config["datasets"]["nq"]["relevance"] == "answers"
    for stage in ("retriever", "distill"):
        params = stage_params(config, "nq", stage)
        assert (params["learning_rate"], params["train_steps"], params["passage_max_length"]) == (5e-6, 20000, 192)
    mining = stage_params(config, "nq", "mining")
    assert mining["retriever1"]["depth"] == mining["retriever2"]["depth"] == 100      # §B: top-100 predictions
    assert stage_params(config, "nq", "pretrain")["train_steps"] == 200000           # §4.1
    assert "train_steps" not in stage_params(config, "scifact", "retriever")          # epochs elsewhere
    assert config["datasets"]["nq"]["metrics"] == ["R@5", "R@20", "R@100"]


@pytest.mark.slow
def test_whole_nq_chain_from_dpr_files_to_top_k_accuracy(tmp_path):
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    dataset = config["datasets"]["nq"]
    # a copy, so that nothing the chain writes lands in the repository's fixture
    dataset["path"] = str(shutil.copytree(FIXTURE, tmp_path / "nq_files"))
    dataset.pop("resources")
    tiny = str(make_tiny_bert(tmp_path / "tiny_bert"))
    small = dict(plm=tiny, learning_rate=1e-3, batch_size=8, warmup_steps=1, save_steps=50, processes=1, min_steps=0)
    dataset["stages"] = {
        "bm25": {"threads": 1, "depth": 100},
        "retriever": {**small, "train_steps": 3, "negatives_per_query": 2, "search_depth": 100,
                      "passage_max_length": 48, "encode_shards": 1, "encode_batch_size": 64},
        "reranker": {**small, "epochs": 1, "negatives_per_query": 2, "rerank_depth": 20, "max_length": 64,
                     "teacher_shards": 1, "score_batch_size": 64},
        "distill": {**small, "train_steps": 2, "negatives_per_query": 2, "passage_max_length": 48},
        "mining": {"retriever1": {"depth": 20, "keep": 5}, "retriever2": {"depth": 20, "keep": 3}},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    run_snakemake(tmp_path, "results/nq/summary.json", *[f"results/nq/{stage}/metrics.json" for stage in
                                                        ("bm25", "retriever1", "retriever2", "reranker", "distill")],
                  check=True)
    results = tmp_path / "results" / "nq"

    for stage in ("bm25", "retriever1", "retriever2", "reranker", "distill"):
        metrics = json.loads((results / stage / "metrics.json").read_text())
        test = metrics["test"]
        assert list(metrics) == ["test", "counts", "per_query", "provenance"] and test["num_queries"] == 10, stage
        assert metrics["provenance"]["manifest"] == f"results/nq/{stage}/manifest.json", stage
        assert 0 <= test["R@5"] <= test["R@20"] <= test["R@100"] <= 1, stage
    # BM25's numbers, recomputed here from its run and the raw answers with has_answer
    corpus = read_artifact(results / "data" / "corpus.parquet", "corpus").set_index("doc_id")["text"]
    answers = read_artifact(results / "data" / "answers_test.parquet", "answers")
    run = pd.read_csv(results / "bm25" / "run_test.trec", sep=" ", header=None, dtype={0: str, 2: str},
                      names=["query_id", "q0", "doc_id", "rank", "score", "tag"])
    first = {}
    for qid, wanted in zip(answers["query_id"], answers["answers"]):
        hits = run[run["query_id"] == qid].sort_values("rank")
        first[qid] = next((r for d, r in zip(hits["doc_id"], hits["rank"]) if has_answer(wanted, corpus[d])), None)
    bm25 = json.loads((results / "bm25" / "metrics.json").read_text())["test"]
    for k in (5, 20, 100):
        assert bm25[f"R@{k}"] == pytest.approx(sum(r is not None and r <= k for r in first.values()) / 10)
    assert bm25["R@20"] >= 0.8                    # the fixture's questions share their answer passage's words

    # Retriever1 trained on DPR's hard_negative_ctxs; mined negatives (Retriever1 and 2) contain no answer
    official = pq.read_schema(results / "bm25" / "negatives.parquet").metadata[b"dpr_pipeline.source"]
    assert official == b"official"
    train_answers = read_artifact(results / "data" / "answers_train.parquet", "answers")
    answers_of = dict(zip(train_answers["query_id"], train_answers["answers"]))
    for stage, depth in (("retriever1", 20), ("retriever2", 20)):
        mined = read_artifact(results / stage / "negatives.parquet", "negatives")
        assert mined["negative_ids"].map(len).sum() > 0
        for qid, negatives in zip(mined["query_id"], mined["negative_ids"]):
            assert not any(has_answer(answers_of[qid], corpus[d]) for d in negatives), (stage, qid)
        # the fixture's founders also appear in another topic's passage: such non-positive answer hits were in
        # the mined depth and were left out
        train_run = pd.read_csv(results / stage / "run_train.trec", sep=" ", header=None, dtype={0: str, 2: str},
                                names=["query_id", "q0", "doc_id", "rank", "score", "tag"])
        positives = dict(zip(mined["query_id"], mined["positive_ids"]))
        top = train_run[train_run["rank"] <= depth]
        assert any(has_answer(answers_of[q], corpus[d]) and d not in positives[q]
                   for q, d in zip(top["query_id"], top["doc_id"]))
    steps = [json.loads(line)["step"] for line in (results / "retriever1" / "loss_log.jsonl").read_text().splitlines()]
    assert max(steps) == 3                         # train_steps, not epochs
    summary = (results / "summary.md").read_text()
    assert "R@20" in summary and "R@100" in summary


def test_json_array_streams_across_chunk_boundaries_with_line_numbers(tmp_path):
    from dpr_pipeline.data.text_files import iter_json_array

    records = [{"question": f"q{i}", "text": "é \" x" * (i % 7)} for i in range(300)]
    path = _write(tmp_path / "big.json", json.dumps(records, indent=4, ensure_ascii=False))
    streamed = list(iter_json_array(path, chunk_chars=37))
    assert [record for _, record in streamed] == records
    assert [line for line, _ in streamed][:3] == [2, 6, 10]          # where each object starts
    bad = path.read_text(encoding="utf-8").replace('"question": "q100",', '"question": "q100" oops,')
    with pytest.raises(DataError, match=r"line 403: not valid JSON"):
        list(iter_json_array(_write(path, bad), chunk_chars=37, max_object_chars=500))


@pytest.mark.slow
def test_slurm_dry_run_of_the_nq_chain(tmp_path):
    """The cluster plan of the real NQ run, with the stand-in for the data."""
    done = slurm_dry_run(copy_repo(tmp_path / "repo"), "results/nq/distill/metrics.json", "--configfile",
                         "tests/data/nq/standin.yaml")
    assert done.returncode == 0, done.stderr[-4000:]
    jobs = planned_jobs(done.stdout)
    assert jobs["ingest_answers"] == 2 and jobs["ingest_official_negatives"] == 1 and jobs["pretrain"] == 1
    assert jobs["encode_corpus"] == 3 * 64 and jobs["teacher_scores_shard"] == 64
    assert "bm25_negatives" in jobs and jobs["train_retriever"] == 2

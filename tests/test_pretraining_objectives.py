"""The defining property of each pre-training method, on a small in-memory BERT (100-token vocabulary)."""

import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForMaskedLM

from dpr_pipeline.pretraining import objectives
from dpr_pipeline.pretraining.masking import bert_corrupt, content_positions, nested_mask, random_mask
from dpr_pipeline.pretraining.methods import METHODS, ObjectiveSettings, pretraining_method
from dpr_pipeline.pretraining.objectives import (
    PretrainingModel,
    SpecialTokens,
    TokenGenerator,
    compile_layers,
    local_causal_mask,
)
from dpr_pipeline.pretraining.span_contrast import cocondenser_step
from dpr_pipeline.pretraining.train import training_step
from dpr_pipeline.training.distributed import Distributed

SPECIAL = SpecialTokens(cls=1, sep=2, pad=0, mask=3)
VOCAB = 100


def small_masked_lm(seed=0, dropout=0.0, layers=2, hidden=32):
    torch.manual_seed(seed)
    return BertForMaskedLM(BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                                      num_attention_heads=2, intermediate_size=2 * hidden,
                                      max_position_embeddings=128, hidden_dropout_prob=dropout,
                                      attention_probs_dropout_prob=dropout))


def make_model(method, **settings):
    settings = ObjectiveSettings(**{"method": method, "condenser_skip_layer": 1, "bottleneck": "cls", **settings})
    generator = TokenGenerator(small_masked_lm(seed=1, hidden=16), trainable=True) \
        if pretraining_method(method).generator else None
    return PretrainingModel(small_masked_lm(), settings, SPECIAL, generator)


def make_batch(rows=8, length=24, seed=0):
    """[CLS] content… [SEP] [PAD]…: row r has length − r % 4 real tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (rows, length), generator=g)
    mask = torch.ones(rows, length, dtype=torch.long)
    for r in range(rows):
        real = length - r % 4
        ids[r, 0], ids[r, real - 1] = SPECIAL.cls, SPECIAL.sep
        ids[r, real:] = SPECIAL.pad
        mask[r, real:] = 0
    return ids, mask, content_positions(ids, mask, SPECIAL.ids)


def run(model, ids, mask, content, seed=0):
    torch.manual_seed(seed)
    importance = torch.rand(ids.shape) if model.method.ngram_counts else None
    return model(ids, mask, content, importance)


def test_content_positions_exclude_special_tokens_and_padding():
    ids, mask, content = make_batch(rows=4, length=6)
    assert content[0].tolist() == [False, True, True, True, True, False]
    assert content[1].tolist() == [False, True, True, True, False, False]


def test_random_and_nested_mask_rates():
    torch.manual_seed(0)
    eligible = torch.rand(300, 300) < 0.9
    inner = random_mask(eligible, 0.3)
    outer = nested_mask(inner, eligible, 0.3, 0.5)
    assert not (inner & ~eligible).any() and not (outer & ~eligible).any()
    assert not (inner & ~outer).any()  # every encoder-masked position is decoder-masked
    assert inner[eligible].float().mean().item() == pytest.approx(0.3, abs=0.005)
    assert outer[eligible].float().mean().item() == pytest.approx(0.5, abs=0.005)
    with pytest.raises(ValueError, match="between the inner rate"):
        nested_mask(inner, eligible, 0.5, 0.3)


def test_bert_corrupt_is_80_10_10():
    torch.manual_seed(0)
    ids = torch.randint(5, VOCAB, (400, 250))
    mask = torch.rand(ids.shape) < 0.5
    corrupted = bert_corrupt(ids, mask, SPECIAL.mask, VOCAB)
    assert torch.equal(corrupted[~mask], ids[~mask])
    masked = corrupted[mask]
    assert (masked == SPECIAL.mask).float().mean().item() == pytest.approx(0.8, abs=0.01)
    # 10 % random tokens (1 % of which happen to equal the original) and 10 % kept
    assert (masked == ids[mask]).float().mean().item() == pytest.approx(0.1 + 0.1 / VOCAB, abs=0.01)


@pytest.mark.parametrize("trainable", [True, False])
def test_the_generator_equals_the_straightforward_computation(trainable):
    """Against the textbook ELECTRA step, float32 without autocast: the Hugging Face head over the masked rows'
    whole logits, one uniform draw per row from the same RNG state pushed through the softmax's CDF, the mean
    F.cross_entropy. The same replacements, the loss to 1e-6 relative and the generator's gradients to 1e-5
    (float32 sums in other groupings)."""
    ids, attention, content = make_batch(rows=16, length=24)
    mask = random_mask(content, 0.5)
    results = []
    for ours in (True, False):
        generator = TokenGenerator(small_masked_lm(seed=1, hidden=16), trainable=trainable)
        torch.manual_seed(7)
        if ours:
            replaced, loss = generator.replace(ids, attention, mask, SPECIAL.mask)
        else:
            with torch.enable_grad() if trainable else torch.no_grad():
                hidden = generator.backbone(input_ids=ids.masked_fill(mask, SPECIAL.mask),
                                            attention_mask=attention).last_hidden_state
                logits = generator.head(hidden[mask]).float()
            cdf = logits.detach().softmax(-1).cumsum(-1)
            drawn = torch.searchsorted(cdf, torch.rand(len(cdf), 1) * cdf[:, -1:], right=True).squeeze(-1)
            replaced = ids.masked_scatter(mask, drawn)
            loss = F.cross_entropy(logits, ids[mask]) if trainable else None
        grads = {}
        if trainable:
            loss.backward()
            grads = {n: p.grad for n, p in generator.named_parameters() if p.grad is not None}
        results.append((replaced, loss, grads))
    (ours, our_loss, our_grads), (theirs, their_loss, their_grads) = results
    assert mask.sum() > 50 and (ours[mask] != ids[mask]).any()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert (our_loss is None) == (their_loss is None) == (not trainable)
    if trainable:
        assert our_loss.item() == pytest.approx(their_loss.item(), rel=1e-6)
        assert our_grads.keys() == their_grads.keys() and len(our_grads) > 10
        for name in our_grads:
            torch.testing.assert_close(our_grads[name], their_grads[name], rtol=1e-5, atol=1e-7, msg=name)


def test_the_generator_on_every_content_row_gives_the_loss_and_gradients_of_the_masked_rows_alone():
    """Issue 53: SimLM's generator runs its head on the batch's content rows (a number the host knows), the masked
    ones weighted 1, instead of selecting the masked rows (a number only the device knows: a wait per selection).
    Its MLM loss and gradients are those of the masked rows alone; the rows outside the mask keep their token."""
    ids, attention, content = make_batch(rows=16, length=24)
    mask = random_mask(content, 0.3)
    results = []
    for rows in (None, objectives.mask_rows(content)):
        generator = TokenGenerator(small_masked_lm(seed=1, hidden=16), trainable=True)
        torch.manual_seed(7)
        replaced, loss = generator.replace(ids, attention, mask, SPECIAL.mask, rows)
        loss.backward()
        results.append((replaced, loss, {n: p.grad for n, p in generator.named_parameters() if p.grad is not None}))
    (by_mask, mask_loss, mask_grads), (by_content, content_loss, content_grads) = results
    torch.testing.assert_close(content_loss, mask_loss, rtol=1e-6, atol=0)
    assert content_grads.keys() == mask_grads.keys() and len(content_grads) > 10
    for name in mask_grads:
        torch.testing.assert_close(content_grads[name], mask_grads[name], rtol=1e-5, atol=1e-7, msg=name)
    for replaced in (by_mask, by_content):
        assert torch.equal(replaced[~mask], ids[~mask]) and (replaced[mask] != ids[mask]).any()


def test_lm_loss_over_row_indices_equals_the_loss_over_the_boolean_mask():
    model = make_model("mlm")
    ids, _, content = make_batch(rows=6, length=20)
    states = torch.randn(*ids.shape, 32, requires_grad=True)
    by_mask = model.lm_loss(states, ids, content)
    (mask_grad,) = torch.autograd.grad(by_mask, states)
    by_rows = model.lm_loss(states, ids, objectives.mask_rows(content))
    (rows_grad,) = torch.autograd.grad(by_rows, states)
    torch.testing.assert_close(by_rows, by_mask, rtol=1e-6, atol=0)
    torch.testing.assert_close(rows_grad, mask_grad, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("method", ["simlm", "enc_dec_rtd", "autoencoder"])
def test_the_step_of_methods_reading_content_rows_never_waits_on_the_device(method, monkeypatch):
    """Given the collator's ``content_rows``, the forward and backward pass dispatch no op whose result's size or
    value the host must wait for (boolean selections, ``.item()``, transformers' check of a 2-D padding mask):
    on a GPU the host queues the whole step ahead. Counted on the CPU, as on an accelerator, by the ops that would
    wait on a GPU (on a CPU the generator selects its masked rows: nothing waits there)."""
    from dpr_pipeline.training.step_counts import count_ops_and_syncs

    monkeypatch.setattr(objectives, "waits_on_selection", lambda device: True)
    model = make_model(method)
    ids, mask, content = make_batch(rows=8, length=24)
    rows = objectives.mask_rows(content)

    def step():
        model(ids, mask, content, None, rows)["loss"].backward()

    counts = count_ops_and_syncs(step, torch.device("cpu"))
    assert counts["ops"] > 500 and counts["syncs"] == 0, counts["sync_ops"]
    # without the rows, the model makes them: one selection that waits
    counts = count_ops_and_syncs(lambda: model(ids, mask, content)["loss"].backward(), torch.device("cpu"))
    assert counts["syncs"] == 1, counts["sync_ops"]


def test_generator_replaces_at_the_simlm_rates_and_decoder_replacements_contain_encoder_ones():
    model = make_model("simlm")
    ids, mask, content = make_batch(rows=64, length=64)
    torch.manual_seed(0)
    x_enc, x_dec, enc_mask, dec_mask, losses = model.generator_inputs(ids, mask, content)
    assert not (enc_mask & ~dec_mask).any()
    assert not ((x_enc != ids) & ~enc_mask).any() and not ((x_dec != ids) & ~dec_mask).any()
    assert enc_mask[content].float().mean().item() == pytest.approx(0.3, abs=0.02)
    assert dec_mask[content].float().mean().item() == pytest.approx(0.5, abs=0.02)
    assert losses["generator"].requires_grad  # trained jointly (random initialisation)


def predicted_positions(model):
    """Which positions of the encoder's and the decoder's last states each one's LM loss reads: the head runs
    on the selected rows only, so a position is predicted exactly when its state gets a gradient from it."""
    states = {}

    def keep(name):
        def hook(module, inputs, out):
            states[name] = out.last_hidden_state if name == "encoder" else out
        return hook

    hooks = [model.encoder.register_forward_hook(keep("encoder")), model.decoder[-1].register_forward_hook(keep("decoder"))]
    ids, mask, content = make_batch(rows=32, length=48)
    losses = run(model, ids, mask, content)
    for hook in hooks:
        hook.remove()
    rows = [torch.autograd.grad(losses[name], states[name], retain_graph=True)[0].abs().sum(-1) > 0
            for name in ("encoder", "decoder")]
    return rows, content


def test_replaced_lm_predicts_every_content_position():
    (encoder_rows, decoder_rows), content = predicted_positions(make_model("simlm"))
    assert torch.equal(encoder_rows, content) and torch.equal(decoder_rows, content)


def test_masked_lm_predicts_only_masked_positions():
    (encoder_rows, decoder_rows), content = predicted_positions(make_model("enc_dec_mlm"))
    assert not (encoder_rows & ~content).any() and not (decoder_rows & ~content).any()
    assert encoder_rows[content].float().mean().item() == pytest.approx(0.3, abs=0.05)
    assert decoder_rows[content].float().mean().item() == pytest.approx(0.5, abs=0.05)
    assert not (encoder_rows & ~decoder_rows).any()


def encoder_output_gradient(model, loss_name):
    captured = []

    def keep(module, inputs, out):
        out.last_hidden_state.retain_grad()
        captured.append(out)

    handle = model.encoder.register_forward_hook(keep)
    ids, mask, content = make_batch()
    losses = run(model, ids, mask, content)
    handle.remove()
    losses[loss_name].backward()
    return captured[0], ids


@pytest.mark.parametrize("method", ["simlm", "enc_dec_mlm", "enc_dec_rtd", "autoencoder", "cdmae", "seed_encoder"])
def test_decoder_reaches_the_encoder_only_through_cls(method):
    out, _ = encoder_output_gradient(make_model(method), "decoder")
    gradient = out.last_hidden_state.grad
    assert gradient[:, 0].abs().sum() > 0
    assert torch.count_nonzero(gradient[:, 1:]) == 0


@pytest.mark.parametrize("method", ["simlm", "enc_dec_mlm", "enc_dec_rtd", "autoencoder", "cdmae", "seed_encoder"])
def test_a_mean_bottleneck_reaches_every_real_token_alike_and_no_padding(method):
    """``bottleneck: mean``: the decoder reads the mean of the encoder's real positions, so its loss's gradient at
    the encoder's output is one vector / n at each of a passage's n real tokens ([CLS] and [SEP] included, as
    sentence-transformers' mean pooling), 0 at padding."""
    out, ids = encoder_output_gradient(make_model(method, bottleneck="mean"), "decoder")
    gradient = out.last_hidden_state.grad
    _, mask, _ = make_batch()
    for row in range(len(ids)):
        real = int(mask[row].sum())
        assert torch.count_nonzero(gradient[row, real:]) == 0
        assert gradient[row, 0].abs().sum() > 0
        torch.testing.assert_close(gradient[row, :real], gradient[row, :1].expand(real, -1), rtol=1e-5, atol=1e-9)


def test_a_bottleneck_other_than_cls_or_mean_is_refused():
    with pytest.raises(ValueError, match="bottleneck 'max'"):
        make_model("simlm", bottleneck="max")


def test_condenser_head_reads_late_cls_and_early_tokens_through_the_skip_connection():
    model = make_model("condenser")
    captured = []

    def keep(module, inputs, output):
        for state in (output.last_hidden_state, output.hidden_states[1]):
            state.retain_grad()
        captured.append(output)

    handle = model.encoder.register_forward_hook(keep)
    ids, mask, content = make_batch()
    losses = run(model, ids, mask, content)
    handle.remove()
    losses["head"].backward()
    late, early = captured[0].last_hidden_state.grad, captured[0].hidden_states[1].grad
    assert late[:, 0].abs().sum() > 0 and torch.count_nonzero(late[:, 1:]) == 0  # late layers: only [CLS]
    assert early[:, 1:].abs().sum() > 0                                         # early token states: the skip


def test_seed_decoder_attends_to_exactly_k_previous_tokens():
    allowed = local_causal_mask(6, 2)
    assert [row.nonzero().flatten().tolist() for row in allowed] == [[0], [0, 1], [0, 1, 2], [0, 2, 3], [0, 3, 4],
                                                                     [0, 4, 5]]
    ids, _, _ = make_batch(rows=1, length=12)
    changed = ids.clone()
    changed[0, 5] = 7 if ids[0, 5] != 7 else 8
    full = local_causal_mask(12, 2)[None, None]
    for layers, reached in ((1, [5, 6]), (3, [5, 6, 7, 8])):
        model = make_model("seed_encoder", seed_attention_span=2, seed_decoder_layers=layers).eval()
        bottleneck = torch.randn(1, 32)
        base = model.decode(bottleneck, model.decoder_embeddings(ids), full)
        moved = model.decode(bottleneck, model.decoder_embeddings(changed), full)
        # one layer: token 5 reaches the outputs at 5 and 6 (predicting tokens 6 and 7) only; each further
        # layer widens the reach by k − 1 positions, never backwards
        assert ((moved - base).abs().amax(-1)[0] > 0).nonzero().flatten().tolist() == reached


def test_cdmae_bottleneck_is_a_linear_projection_of_cls():
    model = make_model("cdmae")
    assert isinstance(model.projection, torch.nn.Linear)
    losses = run(model, *make_batch())
    losses["loss"].backward()
    assert model.projection.weight.grad.abs().sum() > 0


def test_cocondenser_gradient_cache_equals_the_one_pass_gradient(monkeypatch):
    # masks drawn per position, not per call, so that one pass and chunks corrupt the same tokens
    monkeypatch.setattr(objectives, "random_mask", lambda eligible, rate: eligible & (
        torch.arange(eligible.shape[1]) % 3 == 1))
    monkeypatch.setattr(PretrainingModel, "bert_mask", lambda self, ids, mask: ids.masked_fill(mask, SPECIAL.mask))
    ids, mask, content = make_batch(rows=8, length=20)
    batch = {"input_ids": ids, "attention_mask": mask, "content": content}
    results = []
    for chunk in (0, 3):
        # float64, no autocast: the two computations sum the same terms in another order (8 rows at once vs
        # chunks of 3, 3, 2: other GEMM shapes, other kernels per CPU vendor). In float32 that is not tight
        # enough: the span softmax is near one-hot, so several gradients (the last layer's, reached through
        # [CLS] only) are ~1e-6 differences of O(1) terms and carry float32's 1e-7 as a 1e-2 relative error
        # (it failed on an AMD EPYC, passed on an Intel Xeon). In float64 the same cancellation leaves ~1e-10.
        model = make_model("cocondenser").double()
        loss = cocondenser_step(chunk)(model, batch, Distributed())
        assert not loss.requires_grad and loss.dtype == torch.float64
        results.append((loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (loss_one, grads_one), (loss_cached, grads_cached) = results
    assert loss_cached.item() == pytest.approx(loss_one.item(), rel=1e-12)
    assert grads_one.keys() == grads_cached.keys() and len(grads_one) > 10
    for name in grads_one:
        # relative to the tensor's largest entry: the attention keys' biases have a gradient of exactly 0 in
        # exact arithmetic (softmax ignores a constant shift), i.e. rounding noise of ~1e-13 in both
        scale = grads_one[name].abs().max().item()
        torch.testing.assert_close(grads_cached[name], grads_one[name], rtol=1e-7, atol=1e-9 * max(scale, 1e-6),
                                   msg=name)


def test_a_generator_method_needs_a_generator_and_others_refuse_one():
    with pytest.raises(ValueError, match="needs"):
        PretrainingModel(small_masked_lm(), ObjectiveSettings(method="simlm"), SPECIAL)
    with pytest.raises(ValueError, match="takes no"):
        PretrainingModel(small_masked_lm(), ObjectiveSettings(method="mlm"), SPECIAL,
                         TokenGenerator(small_masked_lm(), trainable=False))
    with pytest.raises(ValueError, match="condenser_skip_layer"):
        PretrainingModel(small_masked_lm(), ObjectiveSettings(method="condenser", condenser_skip_layer=2, bottleneck="cls"),
                         SPECIAL)


def test_a_frozen_generator_gets_no_gradient_and_no_loss():
    generator = TokenGenerator(small_masked_lm(seed=2), trainable=False)
    model = PretrainingModel(small_masked_lm(), ObjectiveSettings(method="simlm", bottleneck="cls"), SPECIAL,
                             generator)
    model.train()
    assert not generator.model.training
    losses = run(model, *make_batch())
    assert "generator" not in losses
    losses["loss"].backward()
    assert all(p.grad is None for p in generator.parameters())


@pytest.mark.parametrize("method", METHODS)
def test_the_model_holds_what_its_method_declares(method):
    declared = METHODS[method]
    model = make_model(method, decoder_layers=1, condenser_head_layers=3, seed_decoder_layers=2)
    assert (model.generator is not None) == declared.generator
    if declared.decoder is None:
        assert model.decoder is None
    else:
        assert len(model.decoder) == getattr(model.settings, declared.decoder.depth)
        last = model.encoder.encoder.layer[-1].state_dict()
        first = model.decoder[0].state_dict()
        assert all(torch.equal(first[k], last[k]) for k in last) == declared.decoder.copied
    assert hasattr(model, "projection") == bool(declared.decoder and declared.decoder.projection)
    assert hasattr(model, "rtd_head") == declared.replaced_token_head
    # a replaced-token head predicts no tokens: the LM head's own layers stay frozen
    assert model.lm_head.predictions.transform.dense.weight.requires_grad == (not declared.replaced_token_head)


@pytest.mark.parametrize("method", METHODS)
def test_token_importance_is_read_exactly_by_the_methods_that_declare_ngram_counts(method):
    """The rule gives the job the corpus n-gram counts only when the method declares them: a method without them
    must run without token importance, and one with them must use it."""
    model = make_model(method)
    ids, mask, content = make_batch()

    def loss(importance):
        torch.manual_seed(0)
        out = model(ids, mask, content, importance)
        return out["loss"] if "loss" in out else out["mlm_sum"]

    if not METHODS[method].ngram_counts:
        assert torch.equal(loss(None), loss(torch.rand(ids.shape)))
        return
    with pytest.raises((TypeError, AttributeError)):
        loss(None)
    ramp = torch.arange(ids.shape[1], dtype=torch.float).expand(ids.shape)
    assert not torch.equal(loss(ramp), loss(-ramp))


@pytest.mark.parametrize("method", METHODS)
def test_every_trainable_parameter_gets_a_gradient(method):
    """DDP (find_unused_parameters off) requires it: no trainable module may sit outside the loss."""
    model = make_model(method)
    ids, mask, content = make_batch()
    batch = {"input_ids": ids, "attention_mask": mask, "content": content}
    if model.method.ngram_counts:
        batch["importance"] = torch.rand(ids.shape)
    torch.manual_seed(0)
    loss = training_step(model.method, model.settings)(model, batch, Distributed())
    if loss.requires_grad:  # a step that back-propagates itself returns its loss detached
        loss.backward()
    missing = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing


def test_the_lm_loss_equals_cross_entropy_of_the_whole_head_output():
    """``lm_loss_sum`` (the head's transform, then the chunked vocabulary projection) against the straightforward
    ``F.cross_entropy(head(states).float(), ...)`` of the Hugging Face head, float32 without autocast: the same
    value and the same gradients for every head parameter and the states (float32 rounding of sums taken in
    other groupings: 1e-6 relative for the loss, 1e-5 for gradients, each within 1e-6 of its tensor's largest value:
    sums over rows taken in AVX2's and AVX512's vector widths differ by a few float32 steps of that value)."""
    masked_lm = small_masked_lm()
    states = torch.randn(37, 32, generator=torch.Generator().manual_seed(3))
    targets = torch.randint(VOCAB, (37,), generator=torch.Generator().manual_seed(4))
    results = []
    for ours in (True, False):
        masked_lm.zero_grad()
        rows = states.clone().requires_grad_()
        loss = objectives.lm_loss_sum(masked_lm.cls, rows, targets) if ours else \
            F.cross_entropy(masked_lm.cls(rows).float(), targets, reduction="sum")
        loss.backward()
        results.append((loss.item(), rows.grad, {n: p.grad.clone() for n, p in masked_lm.cls.named_parameters()
                                                 if p.grad is not None}))
    (ours, ours_rows, ours_grads), (theirs, theirs_rows, theirs_grads) = results
    assert ours == pytest.approx(theirs, rel=1e-6)
    torch.testing.assert_close(ours_rows, theirs_rows, rtol=1e-5, atol=1e-7)
    assert ours_grads.keys() == theirs_grads.keys() and len(ours_grads) >= 4
    for name in ours_grads:
        torch.testing.assert_close(ours_grads[name], theirs_grads[name], rtol=1e-5,
                                   atol=1e-6 * theirs_grads[name].abs().max().item(), msg=name)


def test_compile_layers_compiles_every_transformer_layer_and_keeps_the_parameter_names():
    model = make_model("simlm", decoder_layers=1)
    names = list(model.state_dict())
    assert compile_layers(model) == 2 + 1 + 2      # encoder, decoder, generator (lazy: nothing compiled yet)
    assert list(model.state_dict()) == names


@pytest.mark.slow
def test_compiled_layers_give_the_eager_loss_and_gradients(tmp_path, monkeypatch):
    """``pretrain.compile`` on this machine's CPU (inductor through its C++ compiler; ~1 min on 2 cores): one
    SimLM step, float32, no dropout (inductor's dropout draws from its own RNG), the same masks and generator
    samples: the loss to 1e-5 relative and every gradient to 1e-4 relative / 1e-6 absolute (fused kernels
    reorder float32 sums). Inductor's kernels are built in the test's own cache folder: the machine-wide
    /tmp/torchinductor_<user> is shared with whatever else compiles there at the same time (another checkout's
    tests loaded a half-written kernel from it once)."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))

    ids, mask, content = make_batch()
    counters.clear()
    results = []
    for compiled in (False, True):
        model = make_model("simlm")
        if compiled:
            compile_layers(model)
        model.train()
        losses = run(model, ids, mask, content)
        losses["loss"].backward()
        results.append((losses["loss"].item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (eager, eager_grads), (compiled, compiled_grads) = results
    assert counters["stats"]["unique_graphs"] > 0   # inductor compiled the layers, none fell back unseen
    assert compiled == pytest.approx(eager, rel=1e-5)
    assert compiled_grads.keys() == eager_grads.keys()
    for name in eager_grads:
        torch.testing.assert_close(compiled_grads[name], eager_grads[name], rtol=1e-4, atol=1e-6,
                                   msg=lambda default: f"{name}: {default}")


@pytest.mark.parametrize("method", [m.name for m in METHODS.values() if m.unpadded])
def test_an_unpadded_method_has_the_padded_loss_and_gradients_on_packed_batches(method, monkeypatch):
    """Issue 53: the collator packs the texts' real tokens (``PretrainingCollator(packed=True)``) and every method
    declared ``unpadded`` gives the padded batch's losses and gradients. The masks' uniform draws and BERT's random
    tokens come from one table per token, the same in either layout (torch draws them per tensor shape)."""
    from dpr_pipeline.models.packing import packed_attention_for
    from dpr_pipeline.pretraining import masking
    from dpr_pipeline.pretraining.train import PretrainingCollator

    examples = [[torch.randint(5, VOCAB, (n,)).numpy()] for n in (12, 20, 7, 16, 20, 9)]
    padded = PretrainingCollator(SPECIAL)(examples)
    rows = padded["attention_mask"].flatten().nonzero().squeeze(1)
    g = torch.Generator().manual_seed(3)
    shape = padded["input_ids"].shape
    uniforms, tokens = torch.rand(shape, generator=g), torch.randint(5, VOCAB, shape, generator=g)

    def per_token(table):
        return lambda shape: table if tuple(shape) == tuple(table.shape) else table.flatten()[rows][None]

    monkeypatch.setattr(masking, "_uniform", lambda shape, device, generator: per_token(uniforms)(shape))
    monkeypatch.setattr(masking.torch, "randint", lambda high, shape, **kw: per_token(tokens)(shape))
    results = []
    for packed in (False, True):
        model = make_model(method)
        with packed_attention_for(model, "test", None if packed else "padded run") as packing:
            assert packing == packed
            batch = PretrainingCollator(SPECIAL, packed=packed)(examples)
            torch.manual_seed(0)
            losses = model(batch["input_ids"], batch["attention_mask"], batch["content"], None, batch["content_rows"])
            losses["loss"].backward()
        results.append(({k: v.detach() for k, v in losses.items()},
                        {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (padded_losses, padded_grads), (packed_losses, packed_grads) = results
    assert batch["input_ids"].shape == (1, len(rows))
    for name in padded_losses:
        torch.testing.assert_close(packed_losses[name], padded_losses[name], rtol=1e-5, atol=1e-6, msg=name)
    assert packed_grads.keys() == padded_grads.keys() and len(packed_grads) > 20
    for name in padded_grads:
        torch.testing.assert_close(packed_grads[name], padded_grads[name], rtol=1e-4, atol=1e-6, msg=name)

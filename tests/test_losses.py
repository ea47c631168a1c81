"""The losses against values worked out by hand (in the comments)."""

import math

import pytest
import torch
import torch.nn.functional as F

from dpr_pipeline.training.losses import (
    at_least_float32,
    contrastive_loss,
    distillation_loss,
    kl_distillation_loss,
    linear_cross_entropy_and_samples,
    linear_cross_entropy_sum,
    listwise_loss,
    span_contrastive_loss,
)

E = math.e
# Two queries, each with [d⁺, n]: q1 = d1⁺ = n2 = (1, 0); q2 = d2⁺ = n1 = (0, 1).
QUERIES = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
PASSAGES = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])  # d1⁺, n1, d2⁺, n2


def test_contrastive_loss_by_hand():
    # τ = 1. Query 1: φ(q1, ·) over [d1⁺, n1, d2⁺, n2] = [e, 1, 1, e]; φ(d1⁺, ·) over [n1, d2⁺, n2] = [1, 1, e].
    # Eq. 3: -log(e / (e + (1 + 1 + e) + (1 + 1 + e))) = log(3 + 4/e). Query 2 is symmetric: same value.
    loss = contrastive_loss(QUERIES, PASSAGES, temperature=1.0)
    assert loss.item() == pytest.approx(math.log(3 + 4 / E), rel=1e-6)


def test_contrastive_loss_temperature_and_no_self_term():
    # τ = 0.5 doubles every exponent: -log(e² / (e² + 2(2 + e²))) = log(3 + 4/e²).
    assert contrastive_loss(QUERIES, PASSAGES, 0.5).item() == pytest.approx(math.log(3 + 4 / E**2), rel=1e-6)
    # One query, passages [d⁺, n] with d⁺ = q and n ⟂ q: the d⁺·d⁺ term is excluded, so the denominator is
    # e (positive) + 1 (q·n) + 1 (d⁺·n): loss = log((e + 2) / e).
    loss = contrastive_loss(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]]), 1.0)
    assert loss.item() == pytest.approx(math.log((E + 2) / E), rel=1e-6)


def test_contrastive_loss_rejects_ragged_groups():
    with pytest.raises(ValueError, match="groups"):
        contrastive_loss(QUERIES, PASSAGES[:3], 1.0)


def test_listwise_loss_by_hand():
    # θ = [2, 0, 1], positive first: -log(e² / (e² + 1 + e)) = log(1 + e⁻² + e⁻¹).
    loss = listwise_loss(torch.tensor([[2.0, 0.0, 1.0]]))
    assert loss.item() == pytest.approx(math.log(1 + E**-2 + E**-1), rel=1e-6)


def test_kl_distillation_loss_by_hand():
    # Teacher [0, ln 3] → p = [1/4, 3/4]; student [0, 0] → p = [1/2, 1/2].
    # KL = 1/4 ln(1/2) + 3/4 ln(3/2).
    loss = kl_distillation_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, math.log(3)]]))
    assert loss.item() == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), rel=1e-6)
    # Equal distributions: zero.
    same = torch.tensor([[1.0, 2.0, 3.0]])
    assert kl_distillation_loss(same, same + 5).item() == pytest.approx(0.0, abs=1e-7)


def test_the_teacher_temperature_divides_the_teachers_scores():
    # Teacher [0, 2 ln 3] at T = 2 → [0, ln 3] → p = [1/4, 3/4], the by-hand case above.
    loss = kl_distillation_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, 2 * math.log(3)]]), 2.0)
    assert loss.item() == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), rel=1e-6)
    # Student [0, ln 3] learns the teacher at T = 2 exactly: zero.
    student = torch.tensor([[0.0, math.log(3)]])
    assert kl_distillation_loss(student, torch.tensor([[0.0, 2 * math.log(3)]]), 2.0).item() == pytest.approx(
        0.0, abs=1e-7)


def test_distillation_loss_is_kl_plus_alpha_contrastive():
    # Student scores of each query's own group at τ = 1: query 1 [d1⁺, n1] = [1, 0], query 2 [d2⁺, n2] = [1, 0].
    # Teacher [0, 0] → p = [1/2, 1/2]; student p = [e, 1]/(e + 1).
    # KL = ½ ln(½ (e+1)/e) + ½ ln(½ (e+1)) per query; plus α · log(3 + 4/e).
    teacher = torch.zeros(2, 2)
    kl = 0.5 * math.log(0.5 * (E + 1) / E) + 0.5 * math.log(0.5 * (E + 1))
    expected = kl + 0.2 * math.log(3 + 4 / E)
    assert distillation_loss(QUERIES, PASSAGES, teacher, 1.0, 0.2).item() == pytest.approx(expected, rel=1e-6)
    # A uniform teacher stays uniform at any temperature.
    assert distillation_loss(QUERIES, PASSAGES, teacher, 1.0, 0.2, teacher_temperature=3.0).item() == pytest.approx(
        expected, rel=1e-6)


def test_contrastive_loss_drops_other_copies_of_the_positive():
    # Query 2's negative n2 is query 1's positive d1⁺ (same key 10). For query 1 that copy leaves both sums:
    # denominator e (d1⁺) + (1 + 1) (q1·n1, q1·d2⁺) + (1 + 1) (d1⁺·n1, d1⁺·d2⁺) = e + 4: loss log((e + 4) / e).
    # Query 2 is unchanged: log(3 + 4/e).
    keys = torch.tensor([10, 11, 12, 10])
    expected = (math.log((E + 4) / E) + math.log(3 + 4 / E)) / 2
    assert contrastive_loss(QUERIES, PASSAGES, 1.0, keys).item() == pytest.approx(expected, rel=1e-6)


def test_span_contrastive_loss_by_hand():
    # two documents, two spans each: rows 0,1 = document A, rows 2,3 = document B
    spans = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    # span 0: positive ⟨s0,s1⟩ = 0, others ⟨s0,s2⟩ = 1, ⟨s0,s3⟩ = 0
    # span 1: positive 0, others 1, 0;  span 2: positive ⟨s2,s3⟩ = 0, others ⟨s2,s0⟩ = 1, ⟨s2,s1⟩ = 1
    # span 3: every score 0
    expected = (
        -math.log(1 / (1 + math.e + 1)) * 2
        - math.log(1 / (math.e + math.e + 1))
        - math.log(1 / 3)
    ) / 4
    assert span_contrastive_loss(spans).item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="two per document"):
        span_contrastive_loss(spans[:3])


def test_linear_cross_entropy_by_hand():
    # h = [(1, 0), (0, 1)], W = rows (1, 0), (0, 1), (0, 0) over a 3-word vocabulary, b = (0, 0, 1):
    # row 1 logits (1, 0, 1), target 0: -log(e / (2e + 1)) = log(2 + 1/e); row 2 logits (0, 1, 1), target 2: the same.
    hidden = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], requires_grad=True)
    bias = torch.tensor([0.0, 0.0, 1.0], requires_grad=True)
    loss = linear_cross_entropy_sum(hidden, weight, bias, torch.tensor([0, 2]), chunk_rows=1)
    assert loss.item() == pytest.approx(2 * math.log(2 + 1 / E), rel=1e-6)
    loss.backward()
    # d/db = Σ rows (softmax − one-hot): row 1 (e, 1, e)/(2e+1) − (1, 0, 0), row 2 (1, e, e)/(2e+1) − (0, 0, 1)
    z = 2 * E + 1
    expected_bias = [(E + 1) / z - 1, (1 + E) / z, 2 * E / z - 1]
    torch.testing.assert_close(bias.grad, torch.tensor(expected_bias), rtol=1e-6, atol=1e-7)


def test_row_weights_by_hand():
    """The by-hand case above with row weights (1, 0): the loss and the bias gradient are row 1's alone, row 2
    gets no gradient, and both rows are still sampled (row 2's logits (0, 1, 1): a draw of 0.99 takes word 2)."""
    hidden = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], requires_grad=True)
    bias = torch.tensor([0.0, 0.0, 1.0], requires_grad=True)
    loss, samples = linear_cross_entropy_and_samples(hidden, weight, bias, torch.tensor([0, 2]),
                                                     torch.tensor([0.0, 0.99]), row_weights=torch.tensor([1.0, 0.0]))
    assert loss.item() == pytest.approx(math.log(2 + 1 / E), rel=1e-6) and samples.tolist() == [0, 2]
    loss.backward()
    z = 2 * E + 1
    torch.testing.assert_close(bias.grad, torch.tensor([E / z - 1, 1 / z, E / z]), rtol=1e-6, atol=1e-7)
    assert hidden.grad[1].abs().sum() == 0 and hidden.grad[0].abs().sum() > 0


@pytest.mark.parametrize("chunk_rows", [1, 7, 64, 1000])
def test_linear_cross_entropy_equals_the_whole_logits_computation_in_float32(chunk_rows):
    """The chunked loss and gradients equal ``F.cross_entropy`` over the full [N, V] logits. Tolerance: the same
    float32 products and sums, in other groupings (per chunk; the weight's gradient summed chunk by chunk), so
    agreement to float32 rounding of the sums: 1e-6 relative for the loss, 1e-5 for the gradients."""
    g = torch.Generator().manual_seed(0)
    rows, width, vocab = 150, 16, 301
    hidden = torch.randn(rows, width, generator=g, dtype=torch.float32)
    weight = torch.randn(vocab, width, generator=g) * 0.5
    bias = torch.randn(vocab, generator=g) * 0.1
    targets = torch.randint(vocab, (rows,), generator=g)
    results = []
    for chunked in (True, False):
        h, w, b = (x.clone().requires_grad_() for x in (hidden, weight, bias))
        loss = (linear_cross_entropy_sum(h, w, b, targets, chunk_rows=chunk_rows) if chunked
                else F.cross_entropy(h @ w.T + b, targets, reduction="sum"))
        (0.37 * loss).backward()                      # an upstream gradient other than 1 reaches every input
        results.append((loss.detach(), h.grad, w.grad, b.grad))
    (loss, *grads), (expected, *expected_grads) = results
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(expected.item(), rel=1e-6)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_linear_cross_entropy_under_bf16_autocast_matches_autocast_logits():
    """Under autocast the projection runs in bf16 (as ``nn.Linear`` would) and the rest in float32: equal to
    cross-entropy of autocast's own bf16 logits, up to the GEMMs' accumulation order (bf16 outputs: 1e-3)."""
    g = torch.Generator().manual_seed(1)
    hidden, weight, bias = torch.randn(40, 32, generator=g), torch.randn(97, 32, generator=g), torch.zeros(97)
    targets = torch.randint(97, (40,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy_sum(hidden, weight, bias, targets, chunk_rows=16)
        logits = F.linear(hidden, weight, bias)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert loss.item() == pytest.approx(F.cross_entropy(logits.float(), targets, reduction="sum").item(), rel=1e-3)


@pytest.mark.parametrize("chunk_rows", [1, 7, 1000])
def test_samples_come_from_the_softmax_of_the_same_logits(chunk_rows):
    """``linear_cross_entropy_and_samples``: the loss (and its gradient) of ``linear_cross_entropy_sum``, and per
    row the token whose CDF interval holds the draw, as over the whole logits (float64: rounding cannot move a
    draw across an interval's edge); a token of probability 0 is never drawn."""
    g = torch.Generator().manual_seed(2)
    hidden, weight = torch.randn(60, 8, generator=g, dtype=torch.float64), torch.randn(50, 8, generator=g,
                                                                                      dtype=torch.float64)
    bias = torch.zeros(50, dtype=torch.float64)
    bias[::5] = -float("inf")                         # every fifth word: probability 0
    targets, draws = torch.randint(1, 5, (60,), generator=g), torch.rand(60, generator=g, dtype=torch.float64)
    h = hidden.clone().requires_grad_()
    loss, samples = linear_cross_entropy_and_samples(h, weight, bias, targets, draws, chunk_rows=chunk_rows)
    loss.backward()
    h_alone = hidden.clone().requires_grad_()
    alone = linear_cross_entropy_sum(h_alone, weight, bias, targets, chunk_rows=chunk_rows)
    alone.backward()
    assert loss.item() == alone.item() and torch.equal(h.grad, h_alone.grad) and not samples.requires_grad
    cdf = (hidden @ weight.T + bias).softmax(-1).cumsum(-1)
    expected = (draws[:, None] * cdf[:, -1:] >= cdf).sum(-1)   # the CDF steps the scaled draw has passed
    assert torch.equal(samples, expected) and not (samples % 5 == 0).any()


def test_samples_follow_the_softmax():
    """30,000 rows with logits log(0.2, 0.5, 0.3): the sampled frequencies within 0.01 of the probabilities."""
    torch.manual_seed(0)
    probabilities = torch.tensor([0.2, 0.5, 0.3])
    _, samples = linear_cross_entropy_and_samples(torch.zeros(30000, 1), torch.zeros(3, 1), probabilities.log(),
                                                  torch.zeros(30000, dtype=torch.long), torch.rand(30000))
    frequencies = torch.bincount(samples, minlength=3).float() / len(samples)
    assert torch.allclose(frequencies, probabilities, atol=0.01)


def test_at_least_float32_widens_only_narrow_floats():
    assert at_least_float32(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.float32
    wide = torch.ones(2, dtype=torch.float64)
    assert at_least_float32(wide) is wide

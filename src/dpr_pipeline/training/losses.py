"""The training losses of the SimLM paper (§3.2), as small pure functions of score or vector tensors.

* ``contrastive_loss`` — Eq. 3: in-batch and hard negatives, including the φ(d⁺, nᵢ) terms, with
  φ(q, d) = exp(cos(h_q, h_d) / τ).
* ``listwise_loss`` — Eq. 4: the re-ranker's softmax cross-entropy with the positive first.
* ``kl_distillation_loss`` — Eq. 5: KL(p_ranker ‖ p_ret) over one query's positive and negatives.
* ``distillation_loss`` — L = L_kl + α·L_cont.
* ``span_contrastive_loss`` — coCondenser's corpus-level loss (cocondenser.md Eq. 6) over span pairs.
* ``linear_cross_entropy_sum`` — the pre-training LM losses: Σ −log softmax(h Wᵀ + b)[target] over the rows,
  without the [rows, vocabulary] logits of the whole batch in memory; ``linear_cross_entropy_and_samples`` also
  samples a token per row from that softmax (the generator's replacements).

Every loss is a mean over queries (spans for Eq. 6); ``linear_cross_entropy_sum`` is a sum over its rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def contrastive_loss(queries: torch.Tensor, passages: torch.Tensor, temperature: float,
                     passage_keys: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 3 for ``B`` queries and ``B·g`` passages grouped per query as [d⁺, n₁ … n_{g-1}].

    ``queries`` [B, dim] and ``passages`` [B·g, dim] are L2-normalised vectors, so a dot product is the
    cosine. For query i the denominator sums φ(q_i, d) over every passage in the batch (its own positive,
    its hard negatives, and every other query's passages, the in-batch negatives) and φ(d⁺_i, d) over
    the same passages except d⁺_i itself.

    ``passage_keys`` [B·g] (integer ids of the passages) drops from query i's denominator every other copy
    of its own positive: the same passage drawn as another query's negative is not a negative of query i.
    """
    batch, group = queries.shape[0], passages.shape[0] // queries.shape[0]
    if passages.shape[0] != batch * group or group < 1:
        raise ValueError(f"{passages.shape[0]} passages do not split into groups for {batch} queries")
    positive_index = torch.arange(batch, device=queries.device) * group
    query_scores = queries @ passages.T / temperature                    # [B, B·g]: φ(q_i, ·)
    positive_scores = passages[positive_index] @ passages.T / temperature  # [B, B·g]: φ(d⁺_i, ·)
    own = F.one_hot(positive_index, passages.shape[0]).bool()
    copies = own if passage_keys is None else passage_keys[positive_index][:, None] == passage_keys[None, :]
    query_scores = query_scores.masked_fill(copies & ~own, float("-inf"))
    positive_scores = positive_scores.masked_fill(copies, float("-inf"))  # never φ(d⁺_i, d⁺_i)
    logits = torch.cat([query_scores, positive_scores], dim=1)
    return F.cross_entropy(logits, positive_index)


def at_least_float32(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in float32 when it is in a lower precision (bf16/fp16 under autocast), as it is otherwise
    (float32, or float64 in the precision tests): a loss is accumulated in float32 or wider, never narrowed."""
    return tensor if tensor.dtype in (torch.float32, torch.float64) else tensor.float()


def listwise_loss(scores: torch.Tensor) -> torch.Tensor:
    """Eq. 4: ``scores`` [B, n] are θ(q, d) with the positive in column 0 and n−1 negatives after it."""
    return F.cross_entropy(scores, torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device))


def kl_distillation_loss(student_scores: torch.Tensor, teacher_scores: torch.Tensor,
                         teacher_temperature: float = 1.0) -> torch.Tensor:
    """Eq. 5: Σᵢ p_ranker^i log(p_ranker^i / p_ret^i), each p a softmax over one query's row of scores.

    ``student_scores`` [B, n] are the retriever's cos/τ, ``teacher_scores`` [B, n] the re-ranker's θ,
    both over the same passages (positive first). Averaged over the B queries. ``teacher_temperature`` T:
    p_ranker = softmax(θ / T) (the paper's T = 1; T > 1 flattens the teacher's distribution, as FlagEmbedding's
    ``teacher_temperature`` and knowledge distillation's temperature do).
    """
    teacher_log_p = F.log_softmax(at_least_float32(teacher_scores) / teacher_temperature, dim=-1)
    student_log_p = F.log_softmax(at_least_float32(student_scores), dim=-1)
    return (teacher_log_p.exp() * (teacher_log_p - student_log_p)).sum(dim=-1).mean()


def distillation_loss(queries: torch.Tensor, passages: torch.Tensor, teacher_scores: torch.Tensor,
                      temperature: float, alpha: float, passage_keys: torch.Tensor | None = None,
                      teacher_temperature: float = 1.0) -> torch.Tensor:
    """L = L_kl + α·L_cont, the student's KL term over each query's own group of passages [d⁺, n₁ …], the
    teacher's θ over ``teacher_temperature``."""
    batch, group = teacher_scores.shape
    own_group = passages.view(batch, group, -1)
    student_scores = torch.einsum("bd,bgd->bg", queries, own_group) / temperature
    return kl_distillation_loss(student_scores, teacher_scores, teacher_temperature) + alpha * contrastive_loss(
        queries, passages, temperature, passage_keys)


def span_contrastive_loss(spans: torch.Tensor) -> torch.Tensor:
    """coCondenser Eq. 6, averaged over the ``2n`` spans: rows ``2i`` and ``2i+1`` of ``spans`` [2n, H] are the
    two spans of document ``i``. Each span's positive is its sibling, its negatives every other span in the
    batch; the score is the plain inner product ⟨h_ij, h_kl⟩ (no temperature), a span never scores itself."""
    if spans.shape[0] % 2:
        raise ValueError(f"{spans.shape[0]} span vectors: need two per document")
    spans = at_least_float32(spans)
    scores = spans @ spans.T
    scores = scores.masked_fill(torch.eye(len(spans), dtype=torch.bool, device=spans.device), float("-inf"))
    siblings = torch.arange(len(spans), device=spans.device) ^ 1
    return F.cross_entropy(scores, siblings)


#: Rows of ``linear_cross_entropy_sum`` per chunk: 2,048 × 30,522 words is 250 MB of float32 logits at a time.
LM_CHUNK_ROWS = 2048


def linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                             targets: torch.Tensor, chunk_rows: int = LM_CHUNK_ROWS) -> torch.Tensor:
    """Σᵢ −log softmax(hᵢ Wᵀ + b)[targetᵢ] over the rows of ``hidden`` [N, H] (``weight`` [V, H], ``bias`` [V],
    ``targets`` [N]): the value ``F.cross_entropy(hidden @ weight.T + bias, targets, reduction="sum")``.

    The logits are made ``chunk_rows`` rows at a time and their gradient (softmax − one-hot) is taken in the
    same pass, so neither the [N, V] logits nor their float32 copy nor a saved softmax ever exist for the whole
    batch. Under autocast the two matrix products per chunk run in the autocast dtype (bf16: fp32 accumulation
    inside the GEMM); the log-sum-exp, the loss and the weight/bias gradients are accumulated in float32 (or in
    the inputs' own dtype when that is float32 or wider).
    """
    return _linear_cross_entropy(hidden, weight, bias, targets, None, None, chunk_rows)[0]


def linear_cross_entropy_and_samples(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                     targets: torch.Tensor, draws: torch.Tensor,
                                     row_weights: torch.Tensor | None = None,
                                     chunk_rows: int = LM_CHUNK_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`linear_cross_entropy_sum` and, from the same chunks of logits, one token per row drawn from
    softmax(hᵢ Wᵀ + b): the inverse CDF at ``draws``ᵢ (uniform in [0, 1)), a token whose probability is 0 never
    drawn. ELECTRA's generator samples its replacements and scores its MLM loss in one pass over the vocabulary,
    without the [N, V] logits (or their float32 copy, their softmax and its cumulative sum) for the batch.

    ``row_weights`` [N] (None: all 1) weighs each row's loss and gradients: Σᵢ wᵢ·CEᵢ. With 0/1 weights the loss is
    that of the rows weighted 1, while every row is sampled, so a caller can pass a fixed set of rows (a shape the
    host knows) instead of selecting the rows a random mask chose (a shape only the device knows)."""
    return _linear_cross_entropy(hidden, weight, bias, targets, draws, row_weights, chunk_rows)


def _linear_cross_entropy(hidden, weight, bias, targets, draws, row_weights, chunk_rows):
    device_type = hidden.device.type
    compute = (torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type)
               else torch.promote_types(hidden.dtype, weight.dtype))
    return _LinearCrossEntropy.apply(hidden, weight, bias, targets, draws, row_weights, max(1, chunk_rows), compute)


def inverse_cdf_samples(probabilities: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """Row i's token: the first whose cumulative probability exceeds ``draws``ᵢ × the row's total (one uniform
    draw per row; ``torch.multinomial`` draws one exponential per vocabulary entry, ~50× slower on a CPU)."""
    cdf = probabilities.cumsum(-1)
    found = torch.searchsorted(cdf, draws[:, None].to(cdf.dtype) * cdf[:, -1:], right=True).squeeze(-1)
    return found.clamp(max=probabilities.shape[-1] - 1)


class _LinearCrossEntropy(torch.autograd.Function):
    """Forward computes the loss, the samples when asked for and, when needed, the gradients; backward scales
    the gradients by the incoming one (the samples have none)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, draws, row_weights, chunk_rows, compute):
        accumulate = torch.promote_types(compute, torch.float32)
        wants = ctx.needs_input_grad
        total = torch.zeros((), dtype=accumulate, device=hidden.device)
        samples = torch.empty(hidden.shape[0] if draws is not None else 0, dtype=torch.long, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if wants[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=accumulate, device=weight.device) if wants[1] else None
        grad_bias = torch.zeros(bias.shape, dtype=accumulate, device=bias.device) \
            if bias is not None and wants[2] else None
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(compute)
            b = bias.to(compute) if bias is not None else None
            for start in range(0, hidden.shape[0], chunk_rows):
                rows = slice(start, start + chunk_rows)
                h, t = hidden[rows].to(compute), targets[rows]
                weights = None if row_weights is None else row_weights[rows].to(accumulate)
                logits = (h @ w.T if b is None else torch.addmm(b, h, w.T)).to(accumulate)
                log_z = torch.logsumexp(logits, dim=-1)
                losses = log_z - logits.gather(1, t[:, None]).squeeze(1)
                total += (losses if weights is None else losses * weights).sum()
                if draws is None and not any(wants[:3]):
                    continue
                grad = logits.sub_(log_z[:, None]).exp_()          # softmax, in place of the logits
                if draws is not None:
                    samples[rows] = inverse_cdf_samples(grad, draws[rows])
                if not any(wants[:3]):
                    continue
                grad[torch.arange(len(t), device=t.device), t] -= 1
                if weights is not None:
                    grad.mul_(weights[:, None])
                if grad_bias is not None:
                    grad_bias += grad.sum(dim=0)
                grad = grad.to(compute)
                if grad_hidden is not None:
                    grad_hidden[rows] = (grad @ w).to(hidden.dtype)
                if grad_weight is not None:
                    grad_weight += (grad.T @ h).to(accumulate)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.dtypes = weight.dtype, None if bias is None else bias.dtype
        ctx.mark_non_differentiable(samples)
        return total, samples

    @staticmethod
    def backward(ctx, grad_output, grad_samples):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        weight_dtype, bias_dtype = ctx.dtypes
        scale = grad_output
        return (None if grad_hidden is None else grad_hidden * scale.to(grad_hidden.dtype),
                None if grad_weight is None else (grad_weight * scale).to(weight_dtype),
                None if grad_bias is None else (grad_bias * scale).to(bias_dtype),
                None, None, None, None, None)

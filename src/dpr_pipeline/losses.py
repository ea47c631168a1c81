"""The training losses of the SimLM paper (§3.2), as small pure functions of score or vector tensors.

* ``contrastive_loss`` — Eq. 3: in-batch and hard negatives, including the φ(d⁺, nᵢ) terms, with
  φ(q, d) = exp(cos(h_q, h_d) / τ).
* ``listwise_loss`` — Eq. 4: the re-ranker's softmax cross-entropy with the positive first.
* ``kl_distillation_loss`` — Eq. 5: KL(p_ranker ‖ p_ret) over one query's positive and negatives.
* ``distillation_loss`` — L = L_kl + α·L_cont.
* ``span_contrastive_loss`` — coCondenser's corpus-level loss (cocondenser.md Eq. 6) over span pairs.

Every loss is a mean over queries (spans for Eq. 6).
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


def listwise_loss(scores: torch.Tensor) -> torch.Tensor:
    """Eq. 4: ``scores`` [B, n] are θ(q, d) with the positive in column 0 and n−1 negatives after it."""
    return F.cross_entropy(scores, torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device))


def kl_distillation_loss(student_scores: torch.Tensor, teacher_scores: torch.Tensor) -> torch.Tensor:
    """Eq. 5: Σᵢ p_ranker^i log(p_ranker^i / p_ret^i), each p a softmax over one query's row of scores.

    ``student_scores`` [B, n] are the retriever's cos/τ, ``teacher_scores`` [B, n] the re-ranker's θ,
    both over the same passages (positive first). Averaged over the B queries.
    """
    teacher_log_p = F.log_softmax(teacher_scores.float(), dim=-1)
    student_log_p = F.log_softmax(student_scores.float(), dim=-1)
    return (teacher_log_p.exp() * (teacher_log_p - student_log_p)).sum(dim=-1).mean()


def distillation_loss(queries: torch.Tensor, passages: torch.Tensor, teacher_scores: torch.Tensor,
                      temperature: float, alpha: float, passage_keys: torch.Tensor | None = None) -> torch.Tensor:
    """L = L_kl + α·L_cont, the student's KL term over each query's own group of passages [d⁺, n₁ …]."""
    batch, group = teacher_scores.shape
    own_group = passages.view(batch, group, -1)
    student_scores = torch.einsum("bd,bgd->bg", queries, own_group) / temperature
    return kl_distillation_loss(student_scores, teacher_scores) + alpha * contrastive_loss(
        queries, passages, temperature, passage_keys)


def span_contrastive_loss(spans: torch.Tensor) -> torch.Tensor:
    """coCondenser Eq. 6, averaged over the ``2n`` spans: rows ``2i`` and ``2i+1`` of ``spans`` [2n, H] are the
    two spans of document ``i``. Each span's positive is its sibling, its negatives every other span in the
    batch; the score is the plain inner product ⟨h_ij, h_kl⟩ (no temperature), a span never scores itself."""
    if spans.shape[0] % 2:
        raise ValueError(f"{spans.shape[0]} span vectors: need two per document")
    scores = spans.float() @ spans.float().T
    scores = scores.masked_fill(torch.eye(len(spans), dtype=torch.bool, device=spans.device), float("-inf"))
    siblings = torch.arange(len(spans), device=spans.device) ^ 1
    return F.cross_entropy(scores, siblings)

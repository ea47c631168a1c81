"""Whether one stage beats another on a split, read over the split's queries: the paired t-test.

Two stages evaluated on one split score the same queries, so their difference is read query by query
(d_q = upper_q − lower_q): its mean, the 95 % confidence interval of that mean (Student's t with n − 1 degrees of
freedom) and the two-sided p-value of the paired t-test, the test IR papers and toolkits (trec_eval users,
ir-measures/ranx comparisons) report between two systems on one topic set, with how many queries each side wins.
On SciFact's 81 dev queries a re-ranker's difference from the retriever it re-ranks has a standard error of about
0.03 nDCG@10: smaller differences are not results, whichever way they point. The seed spread
(:mod:`dpr_pipeline.evaluation.seed_spread`) is the other half: how much a stage moves with its seed on the same
queries.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Mapping

from scipy.special import stdtr, stdtrit  # Student's t cdf and its inverse (scipy.stats takes seconds to import)

#: The confidence level of the interval and the test's significance level (two-sided).
CONFIDENCE = 0.95


@dataclass(frozen=True)
class PairedDifference:
    queries: int
    mean: float        # mean over the queries of upper − lower
    ci95: float        # half-width of the 95 % confidence interval of the mean
    p_value: float     # two-sided paired t-test of a zero mean difference
    wins: int          # queries where upper scores higher
    losses: int        # queries where lower scores higher

    @property
    def significant(self) -> bool:
        return self.p_value < 1 - CONFIDENCE

    def as_dict(self) -> dict:
        return asdict(self)


def paired_difference(upper: Mapping[str, float], lower: Mapping[str, float]) -> PairedDifference:
    """The paired difference ``upper − lower`` of one metric over the same queries (``{query_id: value}`` each).

    Raises ValueError when the two do not score the same queries (a comparison over different queries would be
    a wrong number) or score fewer than two."""
    if set(upper) != set(lower):
        only = sorted(set(upper) ^ set(lower))[:5]
        raise ValueError(f"the two runs score different queries (e.g. {only}): compare stages on one split's qrels")
    if len(upper) < 2:
        raise ValueError(f"a paired test needs at least 2 queries, got {len(upper)}")
    differences = [upper[q] - lower[q] for q in upper]
    n = len(differences)
    mean = math.fsum(differences) / n
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in differences) / (n - 1))
    if sd == 0.0:  # every query moved by the same amount: no spread to test against
        ci95, p_value = 0.0, 1.0 if mean == 0.0 else 0.0
    else:
        se = sd / math.sqrt(n)
        ci95 = float(stdtrit(n - 1, 0.5 + CONFIDENCE / 2)) * se
        p_value = float(2 * stdtr(n - 1, -abs(mean) / se))
    return PairedDifference(queries=n, mean=mean, ci95=ci95, p_value=p_value,
                            wins=sum(d > 0 for d in differences), losses=sum(d < 0 for d in differences))

"""The paired t-test between two stages' per-query values, against values computed by hand.

With 3 queries (2 degrees of freedom) Student's t has a closed form, F(t) = 1/2 + t / (2 sqrt(t² + 2)), so the
p-value and the interval below are checked without scipy's own numbers."""

from __future__ import annotations

import math

import pytest

from dpr_pipeline.evaluation.paired_difference import paired_difference


def test_three_queries_by_hand():
    # differences 0.1, 0.3, 0.3: mean 0.7/3, sd sqrt(0.02667/2) = 0.11547, se 0.06667, t = 3.5
    result = paired_difference({"a": 0.5, "b": 0.7, "c": 0.9}, {"a": 0.4, "b": 0.4, "c": 0.6})
    assert result.queries == 3 and result.wins == 3 and result.losses == 0
    assert result.mean == pytest.approx(0.7 / 3)
    t = 3.5
    assert result.p_value == pytest.approx(2 * (0.5 - t / (2 * math.sqrt(t * t + 2))), rel=1e-9)   # 0.0728
    t975 = math.sqrt(2 * 0.95 ** 2 / (1 - 0.95 ** 2))     # F(t) = 0.975  <=>  t / sqrt(t² + 2) = 0.95
    assert result.ci95 == pytest.approx(t975 * (0.1 / math.sqrt(0.75)) / math.sqrt(3), rel=1e-9)  # 0.2868
    assert not result.significant                        # p = 0.073: three queries cannot show it


def test_the_sign_follows_upper_minus_lower_and_ties_are_neither_win_nor_loss():
    result = paired_difference({"a": 0.2, "b": 0.5, "c": 0.5}, {"a": 0.4, "b": 0.5, "c": 0.6})
    assert result.mean == pytest.approx(-0.1) and (result.wins, result.losses) == (0, 2)


def test_a_consistent_difference_over_many_queries_is_significant():
    upper = {str(q): 0.5 + 0.1 + 0.01 * (q % 3) for q in range(50)}
    lower = {str(q): 0.5 for q in range(50)}
    result = paired_difference(upper, lower)
    assert result.significant and result.mean - result.ci95 > 0


def test_identical_runs_differ_by_nothing_with_p_one():
    values = {"a": 0.3, "b": 0.9}
    result = paired_difference(values, dict(values))
    assert (result.mean, result.ci95, result.p_value) == (0.0, 0.0, 1.0)


def test_a_constant_nonzero_difference_has_no_spread_and_p_zero():
    result = paired_difference({"a": 0.5, "b": 0.75}, {"a": 0.25, "b": 0.5})
    assert (result.mean, result.ci95, result.p_value) == (0.25, 0.0, 0.0)


@pytest.mark.parametrize("upper, lower, message", [
    ({"a": 1.0, "b": 0.0}, {"a": 1.0, "c": 0.0}, r"different queries \(e.g. \['b', 'c'\]\)"),
    ({"a": 1.0}, {"a": 0.0}, "at least 2 queries"),
])
def test_runs_over_different_queries_are_refused(upper, lower, message):
    with pytest.raises(ValueError, match=message):
        paired_difference(upper, lower)

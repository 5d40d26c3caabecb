"""The correlation hints compare samples within a step: the stratified Spearman against independent computations."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from comgra.analysis.correlation import _spearman_within


def _by_definition(target: np.ndarray, column: np.ndarray, strata: np.ndarray) -> tuple[float, float]:
    """Rank each step's samples on their own, centre them on the step, pool, correlate; the t test of a
    partial correlation given one indicator per step (n - steps - 1 degrees of freedom)."""
    centred_target, centred = np.empty(len(target)), np.empty(len(target))
    for stratum in np.unique(strata):
        rows = strata == stratum
        for out, values in ((centred_target, target), (centred, column)):
            ranks = scipy_stats.rankdata(values[rows])
            out[rows] = ranks - ranks.mean()
    rho = float(np.corrcoef(centred_target, centred)[0, 1])
    freedom = len(target) - len(np.unique(strata)) - 1
    t = rho * np.sqrt(freedom / (1 - rho**2))
    return rho, float(2 * scipy_stats.t.sf(abs(t), freedom))


def test_one_step_is_scipys_spearman() -> None:
    generator = np.random.default_rng(0)
    target = generator.normal(size=40)
    column = target + generator.normal(size=40)
    rho, p_value = _spearman_within(target, column[:, None], np.zeros(40, dtype=np.int64))
    expected = scipy_stats.spearmanr(target, column)
    assert rho[0] == pytest.approx(expected.statistic, abs=1e-12)
    assert p_value[0] == pytest.approx(expected.pvalue, rel=1e-9)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("ties", [False, True])
def test_several_steps_of_unequal_size_match_the_definition(seed, ties) -> None:
    generator = np.random.default_rng(seed)
    strata = np.repeat(np.array([3, 7, 8, 20, 21]), generator.integers(2, 12, size=5))
    generator.shuffle(strata)  # the samples of a step need not be together
    target = generator.normal(size=len(strata)) + strata
    columns = np.column_stack([0.5 * target + generator.normal(size=len(strata)), generator.normal(size=len(strata))])
    if ties:
        target, columns = np.round(target), np.round(columns)
    rho, p_value = _spearman_within(target, columns, strata)
    for index in range(columns.shape[1]):
        expected_rho, expected_p = _by_definition(target, columns[:, index], strata)
        assert rho[index] == pytest.approx(expected_rho, abs=1e-12)
        assert p_value[index] == pytest.approx(expected_p, rel=1e-9)


def test_a_drift_shared_across_steps_is_not_a_link() -> None:
    generator = np.random.default_rng(1)
    strata = np.repeat(np.arange(30), 8)
    target = -strata + generator.normal(size=len(strata))
    feature = -strata + generator.normal(size=len(strata))
    assert scipy_stats.spearmanr(target, feature).statistic > 0.9  # pooled over steps: a strong false link
    rho, p_value = _spearman_within(target, feature[:, None], strata)
    assert abs(rho[0]) < 0.2 and p_value[0] > 0.01

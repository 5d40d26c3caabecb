"""A tensor's distribution across the recorded steps, as TensorBoard's Distributions view draws it.

For each recorded step: percentiles of the stored values (the first ``max_num_neurons_to_record`` values of
every recorded sample, pooled; of the tensor itself when it has no batch dimension) and the exact ``min`` and
``max`` statistics over all its values. One entry per trial that has the tensor, at the selection's iteration
and type of step, as the series plot does. No torch, no Dash.

    >>> [d.trial for d in distributions(service, selection)]  # doctest: +SKIP
    ['trial_bugged_original_version', 'trial_no_activation_function_on_output_layer']
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from comgra.errors import StoreError
from comgra.service.selection import ANY_TYPE, Selection, parse_aggregation

__all__ = ["PERCENTILES", "Distribution", "Histograms", "distributions", "histograms"]

# TensorBoard's: the median, the bands 31-69, 16-84, 7-93 and the range 0-100.
PERCENTILES = (0, 7, 16, 31, 50, 69, 84, 93, 100)


@dataclass(frozen=True)
class Distribution:
    """One trial's distribution: ``percentiles[i, j]`` is PERCENTILES[j] of the values stored at ``steps[i]``;
    ``minimum``/``maximum`` the statistics over all values (the stored ones are the first few only)."""

    trial: str
    steps: np.ndarray
    percentiles: np.ndarray
    minimum: np.ndarray
    maximum: np.ndarray
    values_per_step: int  # how many stored values each step's percentiles come from (the most of any step)


class DistributionSource(Protocol):
    def trials(self) -> list[str]: ...
    def trial(self, trial_id: str) -> Any: ...
    def step_index(self, trial_id: str, rank: int | None = None) -> Any: ...


def distributions(service: DistributionSource, selection: Selection) -> list[Distribution]:
    """The selected tensor's distribution across steps, one entry per trial that has it."""
    batched = parse_aggregation(selection.aggregation)[0] != "none"
    result = []
    for trial_id in service.trials():
        try:
            distribution = _of_trial(service, trial_id, selection, batched)
        except StoreError:
            continue
        if distribution is not None:
            result.append(distribution)
    return result


def _of_trial(service: DistributionSource, trial_id: str, selection: Selection, batched: bool) -> Distribution | None:
    trial = service.trial(trial_id)
    where = {"node": selection.node, "role": selection.role, "kind": selection.kind,
             "iteration": selection.data_iteration, "rank": selection.rank}
    steps, pooled = _pooled(service, trial_id, selection, batched)
    if not len(steps):
        return None
    percentiles = np.array([np.nanpercentile(np.asarray(pooled[int(s)], dtype=np.float64), PERCENTILES)
                            for s in steps])
    extremes = {name: _statistic(trial, where, "mean" if batched else "none", name, steps) for name in ("min", "max")}
    return Distribution(trial_id, steps, percentiles, extremes["min"], extremes["max"],
                        max(len(pooled[int(s)]) for s in steps))


def _pooled(service: DistributionSource, trial_id: str, selection: Selection,
            batched: bool) -> tuple[np.ndarray, dict[int, list[float]]]:
    """The steps (of the selection's type) with a finite stored value, and each step's stored values, pooled
    over the samples of a batch."""
    where = {"node": selection.node, "role": selection.role, "kind": selection.kind,
             "iteration": selection.data_iteration, "rank": selection.rank}
    values = service.trial(trial_id).values_series(**where, aggregation="sample" if batched else "none").to_pydict()
    pooled: dict[int, list[float]] = {}
    for step, stored in zip(values["training_step"], values["neurons"]):
        pooled.setdefault(int(step), []).extend(stored or [])
    steps = np.array(sorted(pooled), dtype=np.int64)
    if selection.type_of_execution != ANY_TYPE:  # as the series plot: iterations mean the same along the curve
        steps = steps[np.isin(steps, service.step_index(trial_id, selection.rank).steps_of(selection.type_of_execution))]
    return np.array([s for s in steps if np.isfinite(pooled[int(s)]).any()], dtype=np.int64), pooled


@dataclass(frozen=True)
class Histograms:
    """TensorBoard's Histograms view: ``counts[trial][i, j]`` is how many finite values stored at
    ``steps[trial][i]`` fall in bin j of ``edges``, which span every trial's values (the same bins in all)."""

    edges: np.ndarray
    steps: dict[str, np.ndarray]
    counts: dict[str, np.ndarray]


def histograms(service: DistributionSource, selection: Selection, *, bins: int | None = None) -> Histograms:
    """The selected tensor's histogram at every recorded step of each trial that has it, over shared bins
    (default: up to 30, fewer where a step keeps few values: 5 values in 30 bins say nothing)."""
    batched = parse_aggregation(selection.aggregation)[0] != "none"
    read: dict[str, tuple[np.ndarray, list[np.ndarray]]] = {}
    for trial_id in service.trials():
        try:
            steps, pooled = _pooled(service, trial_id, selection, batched)
        except StoreError:
            continue
        if len(steps):
            values = [np.asarray(pooled[int(s)], dtype=np.float64) for s in steps]
            read[trial_id] = (steps, [v[np.isfinite(v)] for v in values])
    finite = np.concatenate([v for _, values in read.values() for v in values] or [np.array([])])
    if bins is None:
        bins = min(30, max(5, max((len(v) for _, values in read.values() for v in values), default=0) // 2))
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    edges = np.linspace(low - 0.5, high + 0.5, bins + 1) if low == high else np.linspace(low, high, bins + 1)
    counts = {t: np.array([np.histogram(v, bins=edges)[0] for v in values], dtype=np.int64).reshape(len(steps), bins)
              for t, (steps, values) in read.items()}
    return Histograms(edges, {t: steps for t, (steps, _) in read.items()}, counts)


def _statistic(trial: Any, where: dict[str, Any], aggregation: str, statistic: str, steps: np.ndarray) -> np.ndarray:
    """The statistic at each of ``steps`` (NaN where missing); under a batch, the extreme over the samples."""
    batched = aggregation != "none"
    table = trial.series(**where, aggregation="sample" if batched else "none", sample=None if batched else -1,
                         statistic=statistic).to_pydict()
    combine = min if statistic == "min" else max
    by_step: dict[int, float] = {}
    for step, value in zip(table["training_step"], table["value"]):
        if value is not None:
            by_step[int(step)] = combine(by_step.get(int(step), value), value)
    return np.array([by_step.get(int(s), np.nan) for s in steps], dtype=np.float64)

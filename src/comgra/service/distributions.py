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

__all__ = ["PERCENTILES", "Distribution", "distributions"]

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
    values = trial.values_series(**where, aggregation="sample" if batched else "none").to_pydict()
    if not values["training_step"]:
        return None
    pooled: dict[int, list[float]] = {}
    for step, stored in zip(values["training_step"], values["neurons"]):
        pooled.setdefault(int(step), []).extend(stored or [])
    steps = np.array(sorted(pooled), dtype=np.int64)
    if selection.type_of_execution != ANY_TYPE:  # as the series plot: iterations mean the same along the curve
        steps = steps[np.isin(steps, service.step_index(trial_id, selection.rank).steps_of(selection.type_of_execution))]
    steps = np.array([s for s in steps if np.isfinite(pooled[int(s)]).any()], dtype=np.int64)
    if not len(steps):
        return None
    percentiles = np.array([np.nanpercentile(np.asarray(pooled[int(s)], dtype=np.float64), PERCENTILES)
                            for s in steps])
    extremes = {name: _statistic(trial, where, "mean" if batched else "none", name, steps) for name in ("min", "max")}
    return Distribution(trial_id, steps, percentiles, extremes["min"], extremes["max"],
                        max(len(pooled[int(s)]) for s in steps))


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

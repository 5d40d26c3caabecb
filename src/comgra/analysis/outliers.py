"""Steps where a statistic of a node jumps away from its own course.

Training moves every statistic, so each series is first detrended with a running median; a step
is an outlier when its residual has a robust z-score (median and MAD) above the threshold and lies
outside the interquartile fences too. An IsolationForest (scikit-learn), fitted on per-step feature
vectors (all statistics of a node at once, each node's residuals in units of its own robust spread),
then says whether the step is also unusual as a whole; that raises the confidence. One forest per
trial is fitted on the steps of every candidate node together: the fit's fixed cost is paid once.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.ndimage import median_filter

from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.graphs import GraphFacts
from comgra.analysis.loading import TrialData, as_text, row_types
from comgra.analysis.trends import _iteration_of
from comgra.store import format as fmt

FEATURES = ["abs_mean", "std", "abs_max"]
WINDOW = 9
MIN_STEPS = 12
MIN_STEPS_PER_TYPE = 5
FOREST_TREES = 10
_FOREST_LOCK = threading.Lock()
FOREST_SAMPLES = 256  # steps per tree, drawn from the pooled steps of the candidate nodes
MAX_FINDINGS = 8  # per trial, the strongest
MAX_LISTED_STEPS = 20


def detect(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    return confirmed(data, facts, options, located(data, strongest_of(candidates(data, facts, options))))


def confirmed(data: TrialData, facts: GraphFacts, options: ScanOptions, found: list[_Candidate]) -> list[Finding]:
    """The strongest candidates of a trial, each confirmed (or not) by one IsolationForest."""
    # The forest costs the most: it confirms only the strongest candidates of a trial.
    strongest = strongest_of(found)
    agreements = _forest_agreement(strongest)
    return [_finding(data, facts, options, c, agree) for c, agree in zip(strongest, agreements)]


def strongest_of(found: list[_Candidate]) -> list[_Candidate]:
    """At most ``MAX_FINDINGS`` candidates, the strongest: all a streamed scan keeps between node groups."""
    return sorted(found, key=lambda c: -c.largest)[:MAX_FINDINGS]


def located(data: TrialData, found: list[_Candidate]) -> list[_Candidate]:
    """The candidates with where their worst step is opened, read from ``data`` (which holds their nodes)."""
    for candidate in found:
        candidate.iteration = _iteration_of(data, candidate.node, candidate.kind, candidate.worst_step)
        candidate.unbatched = _unbatched(data, candidate.node, candidate.role)
    return found


def candidates(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[_Candidate]:
    """Every series with outlying steps, with where to open it (the table may hold only some nodes)."""
    return candidates_from(data, facts, options, outlier_steps(data))


def outlier_steps(data: TrialData) -> pd.DataFrame:
    """Per kind, node, role and step (the index: its number and its type, as an evaluation may share a training
    step's number): the median of each feature over the step's rows."""
    stats = data.stats
    rows = stats[stats["aggregation"].isin(["mean", "none"])]
    rows = rows.assign(step_type=row_types(rows, data.steps).astype(str))
    per_step = rows.groupby(["kind", "node", "role", "training_step", "step_type"], sort=True,
                            observed=True)[FEATURES].median()
    index = per_step.index
    return per_step.set_axis(pd.MultiIndex.from_arrays(
        [as_text(index.get_level_values(i)) if i < 3 else index.get_level_values(i) for i in range(5)],
        names=index.names))


def candidates_from(data: TrialData, facts: GraphFacts, options: ScanOptions,
                    per_step: pd.DataFrame) -> list[_Candidate]:
    if not len(per_step):
        return []
    per_step = per_step.sort_index(kind="stable")
    # Steps of different types (sequence lengths, ...) differ by design: each is compared with its own type.
    found = []
    for (kind, node, role), series in per_step.groupby(level=[0, 1, 2], sort=False):
        if len(series) < MIN_STEPS or facts.role.get(node) in ("input", "target"):
            continue
        step_types = series.index.get_level_values("step_type").to_numpy()
        candidate = _candidate(options, kind, node, role, series, step_types)
        if candidate is not None:
            found.append(candidate)
    return found


@dataclass
class _Candidate:
    kind: str
    node: str
    role: str
    steps: np.ndarray  # every step compared
    residuals: np.ndarray  # (steps, features)
    flagged: np.ndarray  # bool per step
    zscores: np.ndarray
    iteration: int = 0  # where the worst step of the node is opened
    unbatched: bool = False

    @property
    def largest(self) -> float:
        return float(np.abs(self.zscores[self.flagged]).max())

    @property
    def worst_step(self) -> int:
        return int(self.steps[self.flagged][np.argmax(np.abs(self.zscores[self.flagged]).max(axis=1))])


def _candidate(options: ScanOptions, kind: str, node: str, role: str, series: pd.DataFrame,
               step_types: np.ndarray) -> _Candidate | None:
    steps = series.index.get_level_values("training_step").to_numpy()
    logs = np.log10(np.abs(series.to_numpy(np.float64)) + 1e-30)
    if not np.isfinite(logs).all():
        return None  # non-finite values are the non-finite detector's
    residuals, usable = _detrended(logs, step_types)
    if usable.sum() < MIN_STEPS:
        return None
    flagged, zscores = _robust_outliers(residuals[usable], options)
    if not flagged.any():
        return None
    return _Candidate(kind, node, role, steps[usable], residuals[usable], flagged, zscores)


def _forest_agreement(candidates: list[_Candidate]) -> list[np.ndarray]:
    """Per candidate, whether the IsolationForest also isolates each of its flagged steps early.

    The steps of all candidates are pooled (each node's residuals scaled by its own robust spread,
    so that a noisy node does not look unusual next to a quiet one) and one forest is fitted."""
    if not candidates:
        return []
    from sklearn.ensemble import IsolationForest  # a second of import time, paid only when a step stands out

    scaled = [_robustly_scaled(c.residuals) for c in candidates]
    pooled = np.vstack(scaled)
    forest = IsolationForest(n_estimators=FOREST_TREES, max_samples=min(FOREST_SAMPLES, len(pooled)),
                             random_state=0)
    # One forest at a time: scikit-learn's joblib wrapper resets the process-wide warning filters while a
    # task runs, and a second thread's forest would read them empty ("should be used with Parallel").
    with _FOREST_LOCK:
        forest.fit(pooled)
        return [forest.predict(rows[c.flagged]) == -1 for c, rows in zip(candidates, scaled)]


def _robustly_scaled(residuals: np.ndarray) -> np.ndarray:
    median = np.median(residuals, axis=0)
    mad = np.median(np.abs(residuals - median), axis=0)
    return (residuals - median) / np.where(mad > 0, mad / 0.6745, 1.0)


def _finding(data: TrialData, facts: GraphFacts, options: ScanOptions, candidate: _Candidate,
             agree: np.ndarray) -> Finding:
    flagged, zscores = candidate.flagged, candidate.zscores
    statistic = FEATURES[int(np.argmax(np.abs(zscores[flagged]).max(axis=0)))]
    outlier_steps = candidate.steps[flagged]
    largest = candidate.largest
    step = candidate.worst_step
    kind, node, role = candidate.kind, candidate.node, candidate.role
    return Finding(
        detector="outlier", severity="info", score=min(1.0, 0.5 * float(agree.mean()) + largest / (10 * options.outlier_z)),
        trial=data.trial, node=node, role=role, kind=kind, training_step=step,
        steps=[int(s) for s in outlier_steps[:MAX_LISTED_STEPS]], iteration=candidate.iteration,
        message=f"{node} ({role}, {kind}) has outlying steps: {len(outlier_steps)} of {len(candidate.steps)} recorded "
                f"steps leave the course of {statistic} (robust z-score up to {largest:.0f}; the IsolationForest "
                f"agrees on {int(agree.sum())} of them). The worst is step {step}.",
        evidence={"statistic": statistic, "robust_z": largest, "outlier_steps": len(outlier_steps),
                  "steps": len(candidate.steps), "isolation_forest_agrees": int(agree.sum())},
        aggregation="none" if candidate.unbatched else "mean", statistic=statistic,
        column=facts.column.get(node, 0))


def _detrended(logs: np.ndarray, step_types: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each step minus the running median of the steps of its type; types with too few steps are left out."""
    residuals = np.zeros_like(logs)
    usable = np.zeros(len(logs), dtype=bool)
    for step_type in set(step_types.tolist()):
        members = np.flatnonzero(step_types == step_type)
        if len(members) < MIN_STEPS_PER_TYPE:
            continue
        part = logs[members]
        window = _window(len(members))
        residuals[members] = part - median_filter(part, size=(window, 1), mode="nearest")
        usable[members] = True
    return residuals, usable


def _robust_outliers(residuals: np.ndarray, options: ScanOptions) -> tuple[np.ndarray, np.ndarray]:
    median = np.median(residuals, axis=0)
    mad = np.median(np.abs(residuals - median), axis=0)
    scale = np.where(mad > 0, mad / 0.6745, np.inf)
    zscores = (residuals - median) / scale
    q1, q3 = np.percentile(residuals, [25, 75], axis=0)
    fence = options.outlier_iqr * (q3 - q1)
    outside = (residuals < q1 - fence) | (residuals > q3 + fence)
    # A jump of under a factor of two is noise, whatever its z-score.
    big = np.abs(residuals - median) > 0.3
    flagged = ((np.abs(zscores) > options.scaled(options.outlier_z)) & outside & big).any(axis=1)
    return flagged, zscores


def _window(length: int) -> int:
    window = min(WINDOW, length if length % 2 else length - 1)
    return max(window, 1)


def _unbatched(data: TrialData, node: str, role: str) -> bool:
    if data.locator is not None:
        return data.locator.only_unbatched(node, role)
    rows = data.stats[(data.stats["node"] == node) & (data.stats["role"] == role)]
    return bool(len(rows)) and bool((rows["aggregation"] == "none").all())

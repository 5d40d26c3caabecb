"""Correlation hints: which per-sample features go with a per-sample target such as the loss.

Every recorded sample of a trial is one observation: the target's value for that sample, and the
features of every other tensor for the same sample, step and iteration (mean, mean of absolute
values, min, max, the first units and their absolute values). Spearman's rank correlation
(scipy.stats) measures each pair; the Benjamini-Hochberg correction accounts for the number of
features tried. The result is a ranked list of plain sentences with the numbers behind them.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.graphs import GraphFacts
from comgra.analysis.loading import NeuronRows, TrialData
from comgra.errors import SelectionError, did_you_mean
from comgra.store import format as fmt

JOIN = ["training_step", "iteration", "sample", "rank"]
ROW_FEATURES = {"mean": "{node}", "abs_mean": "|{node}|", "min": "the minimum of {node}", "max": "the maximum of {node}"}
UNIT_FEATURES = 8
MIN_SAMPLES = 20


@dataclass(frozen=True)
class Feature:
    node: str
    role: str
    label: str


@dataclass(frozen=True)
class FeatureBlock:
    """The features of one tensor: one column each, one row per observation (NaN where it is absent)."""

    features: list[Feature]
    values: np.ndarray  # (observations, features)


def per_sample_tensors(data: TrialData) -> list[str]:
    """The nodes with values per sample: what ``--target`` can name."""
    return sorted(data.neurons["sample"].keys["node"].unique().tolist())


def pick_target(data: TrialData, facts: GraphFacts, wanted: str | None) -> str | None:
    nodes = per_sample_tensors(data)
    if wanted is not None:
        if wanted not in nodes:
            raise SelectionError(f"No per-sample tensor {wanted!r} in trial {data.trial!r} to use as --target"
                                 + did_you_mean(wanted, nodes))
        return wanted
    losses = [n for n in nodes if facts.is_loss_like(n)]
    return sorted(losses, key=lambda n: (n != "loss_per_sample", n))[0] if losses else None


def detect(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    target = pick_target(data, facts, options.target)
    if target is None:
        return []
    samples = data.stats[(data.stats["kind"] == fmt.FORWARD) & (data.stats["aggregation"] == "sample")]
    target_rows = samples[samples["node"] == target]
    target_rows = target_rows[target_rows["role"] == target_rows["role"].iloc[0]] if len(target_rows) else target_rows
    observations = target_rows[JOIN + ["mean"]].rename(columns={"mean": "target"})
    if len(observations) < MIN_SAMPLES:
        return []
    excluded = {target} | facts.feeds.get(target, set())
    # One tensor's block at a time: the features of every tensor are never held together.
    features = _features(data, samples, observations, excluded, facts)
    hints = _significant(observations, features, options)
    findings = []
    for feature, rho, p_value, q_value, n in hints[: options.correlation_max_hints]:
        findings.append(_hint(data, facts, target, feature, rho, p_value, q_value, n, target_rows))
    return findings


def _features(data: TrialData, samples: pd.DataFrame, observations: pd.DataFrame, excluded: set[str],
              facts: GraphFacts):
    """One block per tensor; rows are placed by their position among the observations (one index
    lookup per tensor, no join)."""
    where = pd.MultiIndex.from_frame(observations[JOIN].astype(np.int64))
    units = data.neurons["sample"]
    unit_rows = {key: group.index.to_numpy() for key, group in
                 units.keys.groupby(["node", "role"], sort=False, observed=True)}
    for (node, role), rows in samples.groupby(["node", "role"], sort=False, observed=True):
        if node in excluded or facts.role.get(node) == "output" or facts.is_loss_like(node):
            continue
        features = [Feature(node, role, pattern.format(node=node)) for pattern in ROW_FEATURES.values()]
        values = _placed(where, rows[JOIN], rows[list(ROW_FEATURES)].to_numpy(np.float64))
        block = _unit_features(units, unit_rows.get((node, role)), node, role, where)
        if block is not None:
            features += block.features
            values = np.hstack([values, block.values])
        yield FeatureBlock(features, values)


def _placed(where: pd.MultiIndex, keys: pd.DataFrame, values: np.ndarray) -> np.ndarray:
    """``values`` (one row per key) moved to the rows of the observations they belong to; NaN elsewhere."""
    placed = np.full((len(where), values.shape[1]), np.nan)
    position = where.get_indexer(pd.MultiIndex.from_frame(keys.astype(np.int64)))
    found = position >= 0
    placed[position[found]] = values[found]
    return placed


def _unit_features(units: NeuronRows, index: np.ndarray | None, node: str, role: str,
                   where: pd.MultiIndex) -> FeatureBlock | None:
    if index is None or not len(index):
        return None
    stored = units.matrix(index)
    if stored.shape[1] < 2:
        return None  # a one-unit tensor: its unit is its mean
    matrix = stored[:, :UNIT_FEATURES]
    values = _placed(where, units.keys.loc[index, JOIN], matrix)
    features = [Feature(node, role, label) for unit in range(matrix.shape[1])
                for label in (f"{node}[{unit}]", f"|{node}[{unit}]|")]
    columns = [column for unit in range(matrix.shape[1]) for column in (values[:, unit], np.abs(values[:, unit]))]
    # The unit closest to zero, over every stored unit: a per-sample target that averages over units (a loss
    # per sample) goes with "any unit near zero", which no single unit shows (the tutorial's partial sums).
    with np.errstate(invalid="ignore"):
        nearest = np.nanmin(np.abs(stored), axis=1, keepdims=True) if np.isfinite(stored).any() else stored[:, :1]
    features.append(Feature(node, role, f"the smallest |{node}[i]|"))
    columns.append(_placed(where, units.keys.loc[index, JOIN], nearest)[:, 0])
    return FeatureBlock(features, np.column_stack(columns))


def _significant(observations: pd.DataFrame, blocks: Iterable[FeatureBlock], options: ScanOptions):
    """Spearman's rho and p of every feature against the target, all features of a tensor at once."""
    target = observations["target"].to_numpy(np.float64)
    tested = []
    for block in blocks:
        keep = np.isfinite(target) & np.isfinite(block.values).all(axis=1)
        if keep.sum() < MIN_SAMPLES or np.ptp(target[keep]) == 0:
            continue
        varying = np.ptp(block.values[keep], axis=0) > 0
        if not varying.any():
            continue
        columns = block.values[keep][:, varying]
        rhos, p_values = _spearman(target[keep], columns)
        features = [f for f, v in zip(block.features, varying) if v]
        for feature, r, p_value in zip(features, rhos, p_values):
            if np.isfinite(r):
                tested.append((feature, float(r), float(p_value), int(keep.sum())))
    if not tested:
        return []
    q_values = scipy_stats.false_discovery_control([p for _, _, p, _ in tested], method="bh")
    best: dict[tuple[str, str], tuple] = {}
    min_rho = min(0.99, options.scaled(options.correlation_min_rho))
    for (feature, rho, p_value, n), q_value in zip(tested, q_values):
        if q_value > options.correlation_alpha * options.sensitivity or abs(rho) < min_rho:
            continue
        key = (feature.node, feature.role)
        if key not in best or abs(rho) > abs(best[key][1]):
            best[key] = (feature, rho, p_value, float(q_value), n)
    return sorted(best.values(), key=lambda hint: -abs(hint[1]))


def _spearman(target: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Spearman's rho of ``target`` with each column and its two-sided p-value: Pearson's r of the ranks
    (``scipy.stats.rankdata``) and Student's t with n - 2 degrees of freedom, as ``scipy.stats.spearmanr``
    computes them, without the column-by-column matrix it also builds (the most of its time). No
    warnings machinery: ``warnings.catch_warnings`` is not thread-safe, and trials are scanned in threads."""
    ranked_target = scipy_stats.rankdata(target)
    ranked = scipy_stats.rankdata(columns, axis=0)
    centred_target = ranked_target - ranked_target.mean()
    centred = ranked - ranked.mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = (centred_target @ centred) / np.sqrt((centred_target @ centred_target) * (centred * centred).sum(axis=0))
        rho = np.clip(rho, -1.0, 1.0)
        freedom = len(target) - 2
        t = rho * np.sqrt(freedom / ((1.0 - rho) * (1.0 + rho)))
    return rho, 2 * scipy_stats.t.sf(np.abs(t), freedom)


def _hint(data: TrialData, facts: GraphFacts, target: str, feature: Feature, rho: float, p_value: float,
          q_value: float, n: int, target_rows: pd.DataFrame) -> Finding:
    direction = "high" if rho > 0 else "small"
    sentence = f"{target} is high when {feature.label} is {direction} (Spearman {rho:+.2f} over {n} samples)"
    worst = target_rows.sort_values("mean", ascending=False).iloc[0]
    step, iteration = int(worst["training_step"]), int(worst["iteration"])
    return Finding(
        detector="correlation", severity="info", score=abs(rho), trial=data.trial, node=feature.node,
        role=feature.role, kind=fmt.FORWARD, training_step=step, steps=[], iteration=iteration,
        message=sentence + f"; q = {q_value:.1g} after correcting for the features tried" + (
            f"; {data.subsample}." if data.subsample else "."),
        evidence={"target": target, "feature": feature.label, "spearman": rho, "samples": n, "p_value": p_value,
                  "q_value": q_value, "sentence": sentence},
        aggregation=f"sample:{int(worst['sample'])}", statistic="mean", column=facts.column.get(feature.node, 0))

"""Correlation hints: which per-sample features go with a per-sample target such as the loss.

Every recorded sample of a trial is one observation: the target's value for that sample, and the
features of every other tensor for the same sample, step and iteration (mean, mean of absolute
values, min, max, the first units and their absolute values). Samples are compared only with the
samples of their own step and iteration: a loss and an activation that both change over training
rank together across steps whether or not they are linked sample by sample, and that is training
progress, not a hint. So each pair is measured by a stratified Spearman correlation: both are ranked
within each step (scipy.stats.rankdata), the ranks centred on their step's mean and pooled, which is
the partial rank correlation with the step as a factor, tested with Student's t on
samples - steps - 1 degrees of freedom. The Benjamini-Hochberg correction (scipy.stats) accounts for
the number of features tried. The result is a ranked list of plain sentences with the numbers behind them.

Two roles of one node that hold the same values wherever the target is recorded (the tutorial's
``helper_partial_sums`` at its last iteration, as ``final_sums`` and as ``partial_sums``) are one feature:
tested once, counted once in the correction, and reported as one hint that names both roles.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.graphs import GraphFacts
from comgra.analysis.loading import NeuronRows, TrialData
from comgra.errors import SelectionError, did_you_mean
from comgra.store import format as fmt

JOIN = ["training_step", "iteration", "sample", "rank"]
STRATUM = ["training_step", "iteration"]  # samples that saw the same weights: compared with each other only
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
    # The fingerprint of ``values``, for a node with several roles only: a role whose block has the same one
    # holds the same values at every observation, and is the same feature.
    digest: bytes | None = None


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
    return [_hint(data, facts, target, hint, target_rows) for hint in hints[: options.correlation_max_hints]]


def _features(data: TrialData, samples: pd.DataFrame, observations: pd.DataFrame, excluded: set[str],
              facts: GraphFacts):
    """One block per tensor; rows are placed by their position among the observations (one index
    lookup per tensor, no join)."""
    where = pd.MultiIndex.from_frame(observations[JOIN].astype(np.int64))
    units = data.neurons["sample"]
    unit_rows = {key: group.index.to_numpy() for key, group in
                 units.keys.groupby(["node", "role"], sort=False, observed=True)}
    tensors = samples.groupby(["node", "role"], sort=False, observed=True)
    roles = Counter(node for node, _ in tensors.size().index)
    for (node, role), rows in tensors:
        if node in excluded or facts.role.get(node) == "output" or facts.is_loss_like(node):
            continue
        features = [Feature(node, role, pattern.format(node=node)) for pattern in ROW_FEATURES.values()]
        values = _placed(where, rows[JOIN], rows[list(ROW_FEATURES)].to_numpy(np.float64))
        block = _unit_features(units, unit_rows.get((node, role)), node, role, where)
        if block is not None:
            features += block.features
            values = np.hstack([values, block.values])
        yield FeatureBlock(features, values, _digest(values) if roles[node] > 1 else None)


def _digest(values: np.ndarray) -> bytes:
    return hashlib.blake2b(repr(values.shape).encode() + np.ascontiguousarray(values).tobytes(),
                           digest_size=16).digest()


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


@dataclass(frozen=True)
class Hint:
    feature: Feature
    rho: float  # the within-step (stratified) Spearman correlation
    p_value: float
    q_value: float = 1.0  # after the Benjamini-Hochberg correction over every feature tried
    samples: int = 0  # the samples compared: those of steps with at least two of them
    steps: int = 0  # the (step, iteration) pairs they come from
    roles: tuple[str, ...] = ()  # the node's roles that hold these values (the feature's own first)


def _significant(observations: pd.DataFrame, blocks: Iterable[FeatureBlock], options: ScanOptions) -> list[Hint]:
    """The within-step Spearman rho and p of every feature against the target, all features of a tensor at
    once; the strongest feature of each tensor whose link survives the correction for the features tried."""
    target = observations["target"].to_numpy(np.float64)
    strata = observations.groupby(STRATUM, sort=False).ngroup().to_numpy()
    tested: list[Hint] = []
    first_role: dict[tuple[str, bytes], str] = {}  # (node, digest) -> the role first seen with these values
    same_values: dict[tuple[str, str], list[str]] = {}  # (node, that role) -> every role holding them
    for block in blocks:
        node, role = block.features[0].node, block.features[0].role
        if block.digest is not None:
            seen = first_role.setdefault((node, block.digest), role)
            same_values.setdefault((node, seen), []).append(role)
            if seen != role:
                continue  # the same feature as an earlier role's: tested once
        keep = np.isfinite(target) & np.isfinite(block.values).all(axis=1)
        if keep.sum() >= MIN_SAMPLES:
            tested += _tested_block(target[keep], block.values[keep], strata[keep], block.features)
    if not tested:
        return []
    q_values = scipy_stats.false_discovery_control([hint.p_value for hint in tested], method="bh")
    best: dict[tuple[str, str], Hint] = {}
    min_rho = min(0.99, options.scaled(options.correlation_min_rho))
    for hint, q_value in zip(tested, q_values):
        if q_value > options.correlation_alpha * options.sensitivity or abs(hint.rho) < min_rho:
            continue
        key = (hint.feature.node, hint.feature.role)
        if key not in best or abs(hint.rho) > abs(best[key].rho):
            best[key] = replace(hint, q_value=float(q_value), roles=tuple(same_values.get(key, [key[1]])))
    return sorted(best.values(), key=lambda hint: -abs(hint.rho))


def _tested_block(target: np.ndarray, values: np.ndarray, strata: np.ndarray, features: list[Feature]) -> list[Hint]:
    # A step with one sample has nothing to compare it with: it is left out, and not counted.
    sizes = np.bincount(strata)
    compared = sizes[strata] >= 2
    samples, steps = int(compared.sum()), int((sizes >= 2).sum())
    if samples < MIN_SAMPLES:
        return []
    rhos, p_values = _spearman_within(target[compared], values[compared], strata[compared])
    return [Hint(feature, float(r), float(p), samples=samples, steps=steps)
            for feature, r, p in zip(features, rhos, p_values) if np.isfinite(r)]


def _ranks_within(values: np.ndarray, strata: np.ndarray) -> np.ndarray:
    """Each column's ranks within its stratum (ties averaged), centred on the stratum's mean rank.

    One ``scipy.stats.rankdata`` over the stratum and the global rank together: ordering by the pair
    orders the strata and, inside each, the values, ties kept; centring on the stratum then drops
    the offset of the strata before it."""
    ranks = scipy_stats.rankdata(values, axis=0)
    keyed = strata[:, None].astype(np.float64) * (len(values) + 1) + ranks
    ranks = scipy_stats.rankdata(keyed, axis=0)
    sizes = np.bincount(strata).astype(np.float64)
    means = np.stack([np.bincount(strata, weights=column) for column in ranks.T], axis=1) / sizes[:, None]
    return ranks - means[strata]


def _spearman_within(target: np.ndarray, columns: np.ndarray, strata: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stratified Spearman rho of ``target`` with each column, and its two-sided p-value.

    Pearson's r of the within-stratum centred ranks: the partial rank correlation given the stratum,
    tested with Student's t on n - strata - 1 degrees of freedom (each stratum's mean costs one), as
    ``scipy.stats.spearmanr`` tests the unstratified rho on n - 2. A constant column or a target constant
    within every stratum gives NaN (no test). No warnings machinery: ``warnings.catch_warnings`` is not
    thread-safe, and trials are scanned in threads."""
    strata = np.unique(strata, return_inverse=True)[1]  # numbered 0..k-1: no empty stratum to divide by
    centred_target = _ranks_within(target[:, None], strata)[:, 0]
    centred = _ranks_within(columns, strata)
    freedom = len(target) - int(strata.max()) - 2
    if freedom < 1:
        return np.full(columns.shape[1], np.nan), np.full(columns.shape[1], np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = (centred_target @ centred) / np.sqrt((centred_target @ centred_target) * (centred * centred).sum(axis=0))
        rho = np.clip(rho, -1.0, 1.0)
        t = rho * np.sqrt(freedom / ((1.0 - rho) * (1.0 + rho)))
    return rho, 2 * scipy_stats.t.sf(np.abs(t), freedom)


def _hint(data: TrialData, facts: GraphFacts, target: str, hint: Hint, target_rows: pd.DataFrame) -> Finding:
    feature, rho = hint.feature, hint.rho
    direction = "high" if rho > 0 else "small"
    sentence = (f"{target} is high when {feature.label} is {direction} (Spearman {rho:+.2f} within steps, "
                f"{hint.samples} samples of {hint.steps} {'step' if hint.steps == 1 else 'steps'})")
    roles = list(hint.roles) or [feature.role]
    shared = (f"; {feature.node} holds the same values under its roles {', '.join(roles[:-1])} and {roles[-1]}"
              if len(roles) > 1 else "")
    worst = target_rows.sort_values("mean", ascending=False).iloc[0]
    step, iteration = int(worst["training_step"]), int(worst["iteration"])
    return Finding(
        detector="correlation", severity="info", score=abs(rho), trial=data.trial, node=feature.node,
        role=feature.role, kind=fmt.FORWARD, training_step=step, steps=[], iteration=iteration,
        message=sentence + shared + f"; q = {hint.q_value:.1g} after correcting for the features tried" + (
            f"; {data.subsample}." if data.subsample else "."),
        evidence={"target": target, "feature": feature.label, "roles": roles, "spearman": rho, "within": "step",
                  "samples": hint.samples, "steps_compared": hint.steps, "p_value": hint.p_value,
                  "q_value": hint.q_value, "sentence": sentence},
        aggregation=f"sample:{int(worst['sample'])}", statistic="mean", column=facts.column.get(feature.node, 0))

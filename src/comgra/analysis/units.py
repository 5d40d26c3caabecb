"""Units that never fire, units pinned at the bounds of their range, and tensors with one sign.

Neurons are the recorded values of a tensor's first units: ``abs_max`` rows hold each unit's
largest absolute value over the batch, ``sample`` rows the values of single samples.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.graphs import GraphFacts
from comgra.analysis.loading import TrialData, as_text
from comgra.analysis.trends import NOT_LEARNED, _iteration_of
from comgra.store import format as fmt

MAX_LISTED_UNITS = 20


@dataclass
class DeadPart:
    """What the dead-units detector keeps of one tensor over some steps: mergeable, so that a streamed
    scan reads a node's steps window by window."""

    tensor_type: str
    zero: np.ndarray  # per recorded unit: zero in every row so far
    steps: np.ndarray  # the distinct steps seen

    def merge(self, later: DeadPart) -> DeadPart:
        width = min(len(self.zero), len(later.zero))  # a tensor whose shape changed: the shortest, as matrix()
        return DeadPart(self.tensor_type, self.zero[:width] & later.zero[:width],
                        np.union1d(self.steps, later.steps))


def dead_parts(data: TrialData) -> dict[tuple[str, str], DeadPart]:
    rows = data.neurons["abs_max"]
    parts = {}
    for (node, role), group in rows.keys.groupby(["node", "role"], sort=False, observed=True):
        matrix = rows.matrix(group.index.to_numpy())
        parts[(str(node), str(role))] = DeadPart(str(group["tensor_type"].iloc[0]), (matrix == 0).all(axis=0),
                                                 np.unique(group["training_step"].to_numpy(np.int64)))
    return parts


def dead(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """Units that are zero for every sample of every recorded step."""
    return dead_judged(data, facts, options, dead_parts(data))


def dead_judged(data: TrialData, facts: GraphFacts, options: ScanOptions,
                parts: dict[tuple[str, str], DeadPart]) -> list[Finding]:
    findings = []
    for (node, role), part in parts.items():
        if part.tensor_type in NOT_LEARNED or facts.is_loss_like(node):
            continue
        steps = part.steps
        if len(steps) < options.min_steps or len(part.zero) < 2:
            continue
        is_dead = part.zero
        fraction = float(is_dead.mean())
        severity = _severity(fraction, options.scaled(options.dead_fraction))
        if severity is None:
            continue
        units = np.flatnonzero(is_dead)
        findings.append(Finding(
            detector="dead_units", severity=severity, score=fraction, trial=data.trial, node=node, role=role,
            kind=fmt.FORWARD, training_step=int(steps.min()), steps=sorted(int(s) for s in steps),
            iteration=_iteration_of(data, node, fmt.FORWARD, int(steps.min())),
            message=f"{len(units)} of {len(is_dead)} recorded units of {node} ({role}) are zero for every "
                    f"sample in all {len(steps)} recorded steps ({fraction:.0%}): dead units.",
            evidence={"dead_fraction": fraction, "dead_units": units[:MAX_LISTED_UNITS].tolist(),
                      "recorded_units": int(len(is_dead)), "steps": int(len(steps))},
            aggregation="abs_max", statistic="abs_mean", column=facts.column.get(node, 0)))
    return findings


@dataclass
class SaturatedPart:
    """What the saturated-units detector keeps of one tensor over some steps (mergeable, as ``DeadPart``)."""

    tensor_type: str
    rows: int
    low: float
    high: float
    finite: bool
    pinned_unit: np.ndarray  # per unit: rows within the margin of 0 or 1 (not exactly 0)
    pinned_signed: np.ndarray  # per unit: rows within the margin of -1 or 1 (not exactly 0)
    steps: np.ndarray
    first_sample: int

    def merge(self, later: SaturatedPart) -> SaturatedPart:
        width = min(len(self.pinned_unit), len(later.pinned_unit))
        return SaturatedPart(self.tensor_type, self.rows + later.rows, min(self.low, later.low),
                             max(self.high, later.high), self.finite and later.finite,
                             self.pinned_unit[:width] + later.pinned_unit[:width],
                             self.pinned_signed[:width] + later.pinned_signed[:width],
                             np.union1d(self.steps, later.steps), self.first_sample)


def saturated_parts(data: TrialData, options: ScanOptions) -> dict[tuple[str, str], SaturatedPart]:
    rows = data.neurons["sample"]
    margin = options.saturation_margin
    parts = {}
    for (node, role), group in rows.keys.groupby(["node", "role"], sort=False, observed=True):
        matrix = rows.matrix(group.index.to_numpy())
        finite = bool(np.isfinite(matrix).all())
        nonzero = matrix != 0  # an exact zero is a switched-off ReLU, not a saturated sigmoid
        top = matrix >= 1.0 - margin
        parts[(str(node), str(role))] = SaturatedPart(
            str(group["tensor_type"].iloc[0]), int(matrix.shape[0]),
            float(matrix.min()) if matrix.size else np.inf, float(matrix.max()) if matrix.size else -np.inf, finite,
            (((matrix <= 0.0 + margin) | top) & nonzero).sum(axis=0),
            (((matrix <= -1.0 + margin) | top) & nonzero).sum(axis=0),
            np.unique(group["training_step"].to_numpy(np.int64)), int(group["sample"].iloc[0]))
    return parts


def saturated(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """Units whose values sit at the bounds of a sigmoid-like [0, 1] or tanh-like [-1, 1] range."""
    return saturated_judged(data, facts, options, saturated_parts(data, options))


def saturated_judged(data: TrialData, facts: GraphFacts, options: ScanOptions,
                     parts: dict[tuple[str, str], SaturatedPart]) -> list[Finding]:
    findings = []
    margin = options.saturation_margin
    for (node, role), part in parts.items():
        if part.tensor_type in NOT_LEARNED or facts.is_loss_like(node) or facts.role.get(node) == "output":
            continue
        if part.rows < 10 or len(part.pinned_unit) == 0 or not part.finite:
            continue
        low, high = part.low, part.high
        bounds = (0.0, 1.0) if low >= 0 and high <= 1 else (-1.0, 1.0) if low >= -1 and high <= 1 else None
        if bounds is None:
            continue
        pinned = part.pinned_unit if bounds[0] == 0.0 else part.pinned_signed
        saturated_units = pinned / part.rows >= 0.95
        fraction = float(saturated_units.mean())
        severity = _severity(fraction, options.scaled(options.saturated_fraction))
        if severity is None:
            continue
        steps = sorted(int(s) for s in part.steps)
        findings.append(Finding(
            detector="saturated_units", severity=severity, score=fraction, trial=data.trial, node=node, role=role,
            kind=fmt.FORWARD, training_step=steps[0], steps=steps,
            iteration=_iteration_of(data, node, fmt.FORWARD, steps[0]),
            message=f"{int(saturated_units.sum())} of {len(saturated_units)} recorded units of {node} ({role}) sit "
                    f"within {margin} of the bounds {list(bounds)} for at least 95% of the samples: saturated "
                    "units pass almost no gradient.",
            evidence={"saturated_fraction": fraction, "bounds": list(bounds),
                      "saturated_units": np.flatnonzero(saturated_units)[:MAX_LISTED_UNITS].tolist(),
                      "samples": int(part.rows)},
            aggregation=f"sample:{part.first_sample}", statistic="abs_max",
            column=facts.column.get(node, 0)))
    return findings


def one_sided(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """Tensors whose negative side is orders of magnitude smaller than the positive side, or the reverse.

    Judged step by step, not over the whole run: a network can learn to push values through a wrongly placed
    activation with ever larger inputs (the tutorial's leaky ReLU reaches -32 late in training), so the
    extremes of the whole run hide a stretch of training that was one-sided.
    """
    return one_sided_judged(data, facts, options, one_sided_steps(data))


def one_sided_steps(data: TrialData) -> pd.DataFrame:
    """Per node, role and step: the smallest and largest value and the samples (a step's rows are never split
    between the windows of a streamed scan, so these concatenate)."""
    stats = data.stats
    rows = stats[(stats["kind"] == fmt.FORWARD) & stats["aggregation"].isin(["sample", "none"])]
    rows = rows[~rows["tensor_type"].isin((*NOT_LEARNED, "parameter"))]
    rows = rows[np.isfinite(rows["min"]) & np.isfinite(rows["max"])]
    per_step = rows.groupby(["node", "role", "training_step"], sort=True, observed=True).agg(
        low=("min", "min"), high=("max", "max"), samples=("min", "size")).reset_index()
    return per_step.assign(node=as_text(per_step["node"]), role=as_text(per_step["role"]))


def one_sided_judged(data: TrialData, facts: GraphFacts, options: ScanOptions,
                     per_step: pd.DataFrame) -> list[Finding]:
    if not len(per_step):
        return []
    per_step = per_step.sort_values(["node", "role", "training_step"], kind="stable", ignore_index=True)
    negative = np.maximum(0.0, -per_step["low"].to_numpy(dtype=float))
    positive = np.maximum(0.0, per_step["high"].to_numpy(dtype=float))
    large, small = np.maximum(negative, positive), np.minimum(negative, positive)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_step["ratio"] = np.where(large > 0, small / large, np.nan)
    per_step["negative_small"] = negative < positive
    limit = options.scaled(options.one_sided_ratio)
    findings = []
    for (node, role), steps in per_step.groupby(["node", "role"], sort=False):
        if facts.is_loss_like(node) or facts.role.get(node) in ("output", "input", "target"):
            continue
        sided = steps[steps["ratio"] < limit]
        if len(sided) < options.min_steps:
            continue
        # The side that is small on most of the one-sided steps, and the steps where it is.
        negative_small = bool(sided["negative_small"].mean() >= 0.5)
        sided = sided[sided["negative_small"] == negative_small]
        if len(sided) < options.min_steps:
            continue
        ratio = float(sided["ratio"].median())
        low, high = float(sided["low"].min()), float(sided["high"].max())
        first, last = int(sided["training_step"].iloc[0]), int(sided["training_step"].iloc[-1])
        share = len(sided) / len(steps)
        small_side, large_side = ("negative", "positive") if negative_small else ("positive", "negative")
        into_output = facts.feeds_output(node)
        shape = "a leaky-ReLU-like activation" if ratio > 0 else "a ReLU-like activation"
        when = "on every recorded step" if len(sided) == len(steps) else \
            f"on {len(sided)} of {len(steps)} recorded steps (training steps {first} to {last})"
        message = (f"{node} ({role}) is one-sided {when}: its {small_side} values reach a median {ratio:.2g} of its "
                   f"{large_side} ones (min {low:.3g}, max {high:.3g} on those steps), the signature of {shape}.")
        if into_output:
            message += " It feeds the output without a learned layer in between: is an activation applied where " \
                       "none should be?"
        strength = (1.0 - ratio / limit) * (0.5 + 0.5 * share)
        findings.append(Finding(
            detector="one_sided", severity="warning" if into_output else "info",
            score=strength if into_output else 0.5 * strength, trial=data.trial,
            node=node, role=role, kind=fmt.FORWARD, training_step=first,
            steps=[int(step) for step in sided["training_step"]],  # every one the message counts (listed_steps caps)
            iteration=_iteration_of(data, node, fmt.FORWARD, first), message=message,
            evidence={"negative_extent": max(0.0, -low), "positive_extent": max(0.0, high), "ratio": ratio,
                      "one_sided_steps": len(sided), "recorded_steps": len(steps),
                      "samples": int(sided["samples"].sum()), "feeds_output": into_output},
            aggregation="mean", statistic="min" if negative_small else "max",
            column=facts.column.get(node, 0)))
    return findings


def _severity(fraction: float, warning_at: float) -> str | None:
    if fraction >= warning_at:
        return "warning"
    if fraction >= warning_at / 4:
        return "info"
    return None

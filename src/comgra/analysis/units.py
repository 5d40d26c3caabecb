"""Units that never fire, units pinned at the bounds of their range, and tensors with one sign.

Neurons are the recorded values of a tensor's first units: ``abs_max`` rows hold each unit's
largest absolute value over the batch, ``sample`` rows the values of single samples.
"""
from __future__ import annotations

import numpy as np

from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.graphs import GraphFacts
from comgra.analysis.loading import TrialData
from comgra.analysis.trends import NOT_LEARNED, _iteration_of
from comgra.store import format as fmt

MAX_LISTED_UNITS = 20


def dead(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """Units that are zero for every sample of every recorded step."""
    rows = data.neurons["abs_max"]
    findings = []
    for (node, role), group in rows.keys.groupby(["node", "role"], sort=False):
        if group["tensor_type"].iloc[0] in NOT_LEARNED or facts.is_loss_like(node):
            continue
        steps = group["training_step"].unique()
        if len(steps) < options.min_steps:
            continue
        matrix = rows.matrix(group.index.to_numpy())
        if matrix.shape[1] < 2:
            continue
        is_dead = (matrix == 0).all(axis=0)
        fraction = float(is_dead.mean())
        severity = _severity(fraction, options.scaled(options.dead_fraction))
        if severity is None:
            continue
        units = np.flatnonzero(is_dead)
        findings.append(Finding(
            detector="dead_units", severity=severity, score=fraction, trial=data.trial, node=node, role=role,
            kind=fmt.FORWARD, training_step=int(steps.min()), steps=sorted(int(s) for s in steps),
            iteration=_iteration_of(data, node, fmt.FORWARD, int(steps.min())),
            message=f"{len(units)} of {matrix.shape[1]} recorded units of {node} ({role}) are zero for every "
                    f"sample in all {len(steps)} recorded steps ({fraction:.0%}): dead units.",
            evidence={"dead_fraction": fraction, "dead_units": units[:MAX_LISTED_UNITS].tolist(),
                      "recorded_units": int(matrix.shape[1]), "steps": int(len(steps))},
            aggregation="abs_max", statistic="abs_mean", column=facts.column.get(node, 0)))
    return findings


def saturated(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """Units whose values sit at the bounds of a sigmoid-like [0, 1] or tanh-like [-1, 1] range."""
    rows = data.neurons["sample"]
    findings = []
    margin = options.saturation_margin
    for (node, role), group in rows.keys.groupby(["node", "role"], sort=False):
        if group["tensor_type"].iloc[0] in NOT_LEARNED or facts.is_loss_like(node) \
                or facts.role.get(node) == "output":
            continue
        matrix = rows.matrix(group.index.to_numpy())
        if matrix.shape[0] < 10 or matrix.shape[1] == 0 or not np.isfinite(matrix).all():
            continue
        low, high = float(matrix.min()), float(matrix.max())
        bounds = (0.0, 1.0) if low >= 0 and high <= 1 else (-1.0, 1.0) if low >= -1 and high <= 1 else None
        if bounds is None:
            continue
        # An exact zero is a switched-off ReLU, not a saturated sigmoid.
        pinned = ((matrix <= bounds[0] + margin) | (matrix >= bounds[1] - margin)) & (matrix != 0)
        saturated_units = pinned.mean(axis=0) >= 0.95
        fraction = float(saturated_units.mean())
        severity = _severity(fraction, options.scaled(options.saturated_fraction))
        if severity is None:
            continue
        steps = sorted(int(s) for s in group["training_step"].unique())
        findings.append(Finding(
            detector="saturated_units", severity=severity, score=fraction, trial=data.trial, node=node, role=role,
            kind=fmt.FORWARD, training_step=steps[0], steps=steps,
            iteration=_iteration_of(data, node, fmt.FORWARD, steps[0]),
            message=f"{int(saturated_units.sum())} of {matrix.shape[1]} recorded units of {node} ({role}) sit "
                    f"within {margin} of the bounds {list(bounds)} for at least 95% of the samples: saturated "
                    "units pass almost no gradient.",
            evidence={"saturated_fraction": fraction, "bounds": list(bounds),
                      "saturated_units": np.flatnonzero(saturated_units)[:MAX_LISTED_UNITS].tolist(),
                      "samples": int(matrix.shape[0])},
            aggregation=f"sample:{int(group['sample'].iloc[0])}", statistic="abs_max",
            column=facts.column.get(node, 0)))
    return findings


def one_sided(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """Tensors whose negative side is orders of magnitude smaller than the positive side, or the reverse."""
    stats = data.stats
    rows = stats[(stats["kind"] == fmt.FORWARD) & stats["aggregation"].isin(["sample", "none"])]
    rows = rows[~rows["tensor_type"].isin((*NOT_LEARNED, "parameter"))]
    rows = rows[np.isfinite(rows["min"]) & np.isfinite(rows["max"])]
    if not len(rows):
        return []
    sides = rows.groupby(["node", "role"], sort=False).agg(
        low=("min", "min"), high=("max", "max"), count=("min", "size"), first=("training_step", "min"))
    findings = []
    limit = options.scaled(options.one_sided_ratio)
    for (node, role), side in sides.iterrows():
        if facts.is_loss_like(node) or facts.role.get(node) in ("output", "input", "target"):
            continue
        negative, positive = max(0.0, -float(side["low"])), max(0.0, float(side["high"]))
        large, small = max(negative, positive), min(negative, positive)
        if large == 0 or small / large >= limit or side["count"] < options.min_steps:
            continue
        ratio = small / large
        small_side = "negative" if negative < positive else "positive"
        into_output = facts.feeds_output(node)
        leaky = ratio > 0
        shape = "a leaky-ReLU-like activation" if leaky else "a ReLU-like activation"
        message = (f"{node} ({role}) is one-sided: its {small_side} values reach at most {ratio:.2g} of its "
                   f"{'positive' if small_side == 'negative' else 'negative'} ones (min {float(side['low']):.3g}, "
                   f"max {float(side['high']):.3g} over {int(side['count'])} recorded samples), the signature of "
                   f"{shape}.")
        if into_output:
            message += " It feeds the output without a learned layer in between: is an activation applied where " \
                       "none should be?"
        findings.append(Finding(
            detector="one_sided", severity="warning" if into_output else "info",
            score=1.0 - ratio / limit if into_output else 0.5 * (1.0 - ratio / limit), trial=data.trial,
            node=node, role=role, kind=fmt.FORWARD, training_step=int(side["first"]),
            steps=[], iteration=_iteration_of(data, node, fmt.FORWARD, int(side["first"])), message=message,
            evidence={"negative_extent": negative, "positive_extent": positive, "ratio": ratio,
                      "samples": int(side["count"]), "feeds_output": into_output},
            aggregation="mean", statistic="min" if small_side == "negative" else "max",
            column=facts.column.get(node, 0)))
    return findings


def _severity(fraction: float, warning_at: float) -> str | None:
    if fraction >= warning_at:
        return "warning"
    if fraction >= warning_at / 4:
        return "info"
    return None

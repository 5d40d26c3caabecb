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
    """Tensors whose negative side is orders of magnitude smaller than the positive side, or the reverse.

    Judged step by step, not over the whole run: a network can learn to push values through a wrongly placed
    activation with ever larger inputs (the tutorial's leaky ReLU reaches -32 late in training), so the
    extremes of the whole run hide a stretch of training that was one-sided.
    """
    stats = data.stats
    rows = stats[(stats["kind"] == fmt.FORWARD) & stats["aggregation"].isin(["sample", "none"])]
    rows = rows[~rows["tensor_type"].isin((*NOT_LEARNED, "parameter"))]
    rows = rows[np.isfinite(rows["min"]) & np.isfinite(rows["max"])]
    if not len(rows):
        return []
    per_step = rows.groupby(["node", "role", "training_step"], sort=True).agg(
        low=("min", "min"), high=("max", "max"), samples=("min", "size")).reset_index()
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
            steps=[int(step) for step in sided["training_step"].iloc[:20]],
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

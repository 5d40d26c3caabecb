"""Units judged over the course of training and across each other: units that die partway (alive on the first
recorded steps, zero on every one of the last), units identical to each other (a constant initialisation never
breaks their symmetry), and tensors whose values are almost all exactly zero for each sample (a dropout rate
meant as a keep rate)."""
from __future__ import annotations

import numpy as np

from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.graphs import GraphFacts
from comgra.analysis.loading import TrialData
from comgra.analysis.trends import NOT_LEARNED, _iteration_of
from comgra.store import format as fmt

LATE_SHARE = 0.3  # units zero on every step of the last this share of the recorded steps died
SPARSE_ZEROS = 0.95  # of a sample's values exactly zero, on every recorded step


def _per_step(data: TrialData, frame: str):
    rows = data.neurons[frame]
    for (node, role), group in rows.keys.groupby(["node", "role"], sort=True, observed=True):
        if str(group["tensor_type"].iloc[0]) in NOT_LEARNED:
            continue
        yield str(node), str(role), group, rows.matrix(group.index.to_numpy())


def dying(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    findings = []
    for node, role, group, matrix in _per_step(data, "abs_max"):
        if facts.is_loss_like(node) or matrix.shape[1] < 2:
            continue
        steps = group["training_step"].to_numpy(np.int64)
        order = np.unique(steps)
        if len(order) < max(6, options.min_steps):
            continue
        alive = np.stack([(matrix[steps == s] != 0).any(axis=0) for s in order])  # steps x units
        late = max(3, int(round(LATE_SHARE * len(order))))
        died = np.asarray((~alive[-late:]).all(axis=0) & alive[: len(order) // 3].any(axis=0), dtype=bool)
        fraction = float(died.mean())
        if fraction < options.scaled(options.dead_fraction):
            continue
        first_dead = [int(order[np.flatnonzero(alive[:, u])[-1] + 1]) for u in np.flatnonzero(died)]
        when = int(np.median(first_dead))
        findings.append(Finding(
            detector="dead_units", severity="warning", score=fraction, trial=data.trial, node=node, role=role,
            kind=fmt.FORWARD, training_step=when, steps=[int(s) for s in order if s >= when],
            iteration=_iteration_of(data, node, fmt.FORWARD, when),
            message=f"{int(died.sum())} of {len(died)} recorded units of {node} ({role}) die partway: active on the "
                    f"first recorded steps, zero for every sample from about step {when} on ({fraction:.0%}). A "
                    "learning rate too high, or a large update, pushed them below zero for good.",
            evidence={"dead_fraction": fraction, "died_at_median": when, "recorded_units": int(len(died)),
                      "dead_units": np.flatnonzero(died)[:20].tolist(), "partway": True},
            aggregation="abs_max", statistic="abs_mean", column=facts.column.get(node, 0)))
    return findings


def identical(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    findings = []
    for node, role, group, matrix in _per_step(data, "abs_max"):
        if facts.is_loss_like(node) or matrix.shape[1] < 4 or not np.isfinite(matrix).all():
            continue
        steps = np.unique(group["training_step"].to_numpy(np.int64))
        if len(steps) < options.min_steps:
            continue
        scale = np.abs(matrix).max(axis=1)
        spread = matrix.max(axis=1) - matrix.min(axis=1)
        live = scale > 0
        if live.mean() < 0.5:
            continue  # zero everywhere is the dead-units detector's
        same = spread[live] <= 1e-5 * scale[live]
        if same.mean() < 0.9:
            continue
        findings.append(Finding(
            detector="identical_units", severity="warning", score=0.9, trial=data.trial, node=node, role=role,
            kind=fmt.FORWARD, training_step=int(steps[0]), steps=[int(s) for s in steps],
            iteration=_iteration_of(data, node, fmt.FORWARD, int(steps[0])),
            message=f"All {matrix.shape[1]} recorded units of {node} ({role}) take the same value on "
                    f"{int(same.sum())} of {int(live.sum())} recorded rows: they are copies of one unit. A constant "
                    "initialisation gives every unit the same gradient, so their symmetry never breaks.",
            evidence={"identical_rows": int(same.sum()), "rows": int(live.sum()), "units": int(matrix.shape[1])},
            aggregation="abs_max", statistic="std", column=facts.column.get(node, 0)))
    return findings


def sparse(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    findings = []
    for node, role, group, matrix in _per_step(data, "sample"):
        if facts.is_loss_like(node) or matrix.size < 64 or matrix.shape[1] < 4:
            continue
        steps = group["training_step"].to_numpy(np.int64)
        order = np.unique(steps)
        if len(order) < options.min_steps:
            continue
        zeros = np.asarray([(matrix[steps == s] == 0).mean() for s in order])
        if zeros.min() < 1 - (1 - SPARSE_ZEROS) * options.sensitivity:
            continue
        alive_units = (matrix != 0).any(axis=0).mean()
        if alive_units < 0.5:
            continue  # units that never fire are dead (the dead-units detector), not sparse
        findings.append(Finding(
            detector="sparse_units", severity="warning", score=float(zeros.mean()), trial=data.trial, node=node,
            role=role, kind=fmt.FORWARD, training_step=int(order[0]), steps=[int(s) for s in order],
            iteration=_iteration_of(data, node, fmt.FORWARD, int(order[0])),
            message=f"{zeros.mean():.1%} of the recorded values of {node} ({role}) are exactly zero for each sample "
                    f"(at least {zeros.min():.1%} on every recorded step), though {alive_units:.0%} of its units fire "
                    "for some sample: almost nothing passes. A dropout probability meant as a keep probability?",
            evidence={"zero_fraction": float(zeros.mean()), "units_ever_active": float(alive_units)},
            aggregation="sample:0", statistic="abs_mean", column=facts.column.get(node, 0)))
    return findings

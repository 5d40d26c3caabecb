"""The replicas of a data-parallel run must agree: every rank holds the same parameters after each step.

Each rank writes float64 fingerprints (sum and norm) of every tracked parameter's value at the start of a
recorded step, and of its gradient after the backward pass, into its own shard of the ``runinfo`` table:
no collective is added to the run. Here the ranks' fingerprints of one parameter at one step are compared.
DDP's replicas are bitwise equal, so any difference beyond float64 rounding is a divergence: a parameter
changed on one rank only (an in-place edit, a rank-dependent initialisation after wrapping, a buffer or
parameter DDP does not synchronise, an update outside the wrapped module). The first step where they
differ, and the parameter, are what the finding names. Gradients that differ while the values agree are
reported as information only (gradient accumulation under ``no_sync`` differs on purpose before the last
micro-batch).
"""
from __future__ import annotations

import math

import pandas as pd

from comgra.analysis import evidence_tables as tables
from comgra.analysis import graphs
from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.loading import TrialData

TOLERANCE = 1e-9  # relative: float64 sums of equal tensors are equal; this allows for nothing more than rounding
MAX_FINDINGS = 10


def detect(data: TrialData, facts: graphs.GraphFacts, options: ScanOptions) -> list[Finding]:
    info = tables.table(data, "runinfo")
    if not len(info) or info["rank"].nunique() < 2:
        return []
    nodes = tables.parameter_nodes(data)
    values = _diverging(info, ("value_sum", "value_norm"))
    findings = [_finding(data, facts, nodes, name, step, detail, "error", 1.0, "value") for name, (step, detail) in values]
    grads = [(n, d) for n, d in _diverging(info, ("grad_sum", "grad_norm")) if n not in dict(values)]
    # Info: under no_sync (gradient accumulation) the ranks' gradients differ on purpose until the last micro-batch.
    findings += [_finding(data, facts, nodes, name, step, detail, "info", 0.4, "gradient") for name, (step, detail) in grads]
    for finding in findings[1:]:  # the parameter that diverged first is the origin; the others show it too
        finding.origin = finding.training_step != findings[0].training_step or finding.evidence["what"] != "value"
    return findings[:MAX_FINDINGS]


def _diverging(info: pd.DataFrame, fields: tuple[str, ...]) -> list[tuple[str, tuple[int, dict[str, float]]]]:
    """Parameter -> (first step where the ranks differ, each rank's fingerprint there), earliest first."""
    rows = info[(info["subject"] == "parameter") & info["field"].isin(list(fields))]
    if not len(rows):
        return []
    found: dict[str, tuple[int, dict[str, float]]] = {}
    for (name, step, field), group in rows.groupby(["name", "training_step", "field"], sort=True, observed=True):
        if group["rank"].nunique() < 2 or str(name) in found and found[str(name)][0] <= int(step):
            continue
        numbers = group["number"].tolist()
        if _disagree(numbers):
            found[str(name)] = (int(step), {f"rank {int(r)} {field}": float(v) for r, v in zip(group["rank"], numbers)})
    return sorted(found.items(), key=lambda item: (item[1][0], item[0]))


def _disagree(numbers: list[float]) -> bool:
    finite = [v for v in numbers if not math.isnan(v)]
    if len(finite) != len(numbers):
        return 0 < len(finite)
    low, high = min(finite), max(finite)
    return high - low > TOLERANCE * max(abs(low), abs(high), 1e-30)


def _finding(data: TrialData, facts: graphs.GraphFacts, nodes: dict[str, str], name: str, step: int,
             detail: dict[str, float], severity: str, score: float, what: str) -> Finding:
    node = nodes.get(name, name)
    ranks = ", ".join(f"{k}={v:.10g}" for k, v in sorted(detail.items()))
    if what == "value":
        message = (f"The ranks disagree on parameter {name} from step {step} on ({ranks}): the data-parallel replicas "
                   "diverged. Something changed it on one rank only (an in-place edit, a rank-dependent "
                   "initialisation after wrapping, an update outside the DDP module).")
    else:
        message = (f"The ranks' gradients of parameter {name} differ at step {step} ({ranks}) while its values "
                   "agree: gradients not all-reduced (no_sync, a parameter DDP does not see, find_unused_parameters).")
    return Finding(detector="rank_agreement", severity=severity, score=score, trial=data.trial, node=node, role=name,
                   kind="forward" if what == "value" else None, training_step=step, steps=[step], message=message,
                   evidence={"what": what, **detail}, aggregation="none", column=facts.column.get(node, 0))

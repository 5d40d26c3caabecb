"""Parameters and the optimizer: left out of every parameter group, or meant to be frozen and still changing.

Read from the ``runinfo`` table: each parameter's optimizer groups (for the optimizers the run gave to
``recorder.track_optimizer``, which the Trainer and Lightning callbacks do, and every optimizer torch's global step
hook saw step on a recorded step), ``requires_grad``, the groups'
learning rates, and float64 fingerprints (sum, norm) of each parameter's value and gradient on the recorded
steps.

- *Left out of the optimizer*: a parameter that gets gradients but is in no group of a tracked optimizer
  and never changes (a BatchNorm or a head added after the optimizer was built).
- *A frozen stage that trains*: a parameter with ``requires_grad=False`` (or in a group whose learning rate is
  0) whose value changes between recorded training steps (weight decay or momentum applied to stale
  gradients, a second optimizer, a copy frozen instead of the module).
"""
from __future__ import annotations

import math

import pandas as pd

from comgra.analysis import evidence_tables as tables
from comgra.analysis import graphs
from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.loading import TrialData

RELATIVE_CHANGE = 1e-7  # a fingerprint that moved by less is unchanged (float64 sums of float32 values)
MAX_FINDINGS = 12  # per kind; the rest are counted in the last one's evidence


def detect(data: TrialData, facts: graphs.GraphFacts, options: ScanOptions) -> list[Finding]:
    requires = tables.with_phase(data, tables.runinfo_field(data, "parameter", "requires_grad"))
    if not len(requires):
        return []
    training = requires[requires["phase"] == tables.TRAINING]
    if not len(training):
        return []
    changed = _changes(data)
    nodes = tables.parameter_nodes(data)
    return _left_out(data, facts, training, changed, nodes) + _frozen_but_changing(data, facts, training, changed, nodes)


def _changes(data: TrialData, only: dict[str, set[int]] | None = None) -> dict[str, int]:
    """Parameter -> the first recorded training step at which its value differs from the recorded step before;
    with ``only``, the first such step where the parameter is in ``only[name]`` at both steps."""
    if only is not None and not any(only.values()):
        return {}  # nothing is frozen: no step to compare
    rows = tables.with_phase(data, pd.concat([tables.runinfo_field(data, "parameter", "value_sum"),
                                              tables.runinfo_field(data, "parameter", "value_norm")]))
    if not len(rows):
        return {}
    rows = rows[rows["phase"] == tables.TRAINING]
    found: dict[str, int] = {}
    for (name, _rank, _field), group in rows.groupby(["name", "rank", "field"], sort=True, observed=True):
        wanted = None if only is None else only.get(str(name), set())
        ordered = group.sort_values("training_step")
        values, steps = ordered["number"].tolist(), [int(s) for s in ordered["training_step"]]
        for before, after, earlier, step in zip(values, values[1:], steps, steps[1:]):
            if wanted is not None and not (earlier in wanted and step in wanted):
                continue
            if _differ(before, after):
                found[str(name)] = min(found.get(str(name), step), step)
                break
    return found


def _differ(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) != math.isnan(b)
    return abs(a - b) > RELATIVE_CHANGE * max(abs(a), abs(b), 1e-30)


def _left_out(data: TrialData, facts: graphs.GraphFacts, training: pd.DataFrame, changed: dict[str, int],
              nodes: dict[str, str]) -> list[Finding]:
    groups = tables.with_phase(data, tables.runinfo_field(data, "parameter", "optimizer_group"))
    if not len(groups):
        return []  # no optimizer was tracked: nothing to say about groups
    groups = groups[groups["phase"] == tables.TRAINING]
    in_group = set(groups.loc[groups["value"] != "", "name"].astype(str))
    trainable = set(training.loc[training["value"] == "True", "name"].astype(str))
    gradients = tables.runinfo_field(data, "parameter", "grad_norm")
    with_gradient = set(gradients.loc[gradients["number"] > 0, "name"].astype(str)) if len(gradients) else set()
    missing = sorted(n for n in set(groups["name"].astype(str)) - in_group if n in trainable)
    findings = []
    for name in missing:
        node = nodes.get(name, name)
        steps = sorted({int(s) for s in groups.loc[groups["name"] == name, "training_step"]})
        moves = name in changed
        severity = "info" if moves or name not in with_gradient else "warning"
        why = ("it changes all the same (an optimizer comgra was not given?)" if moves else
               "it gets gradients but never changes" if name in with_gradient else "and it gets no gradient")
        findings.append(Finding(
            detector="optimizer_groups", severity=severity, score=0.95 if severity == "warning" else 0.4,
            trial=data.trial, node=node, role=name, kind="forward", training_step=steps[0], steps=steps,
            message=f"Parameter {name} (requires_grad=True) is in no parameter group of the tracked optimizers: {why}. "
                    "Build the optimizer after the model is complete, or add it with optimizer.add_param_group().",
            evidence={"problem": "not_in_optimizer", "gets_gradient": name in with_gradient, "changes": moves},
            aggregation="none", column=facts.column.get(node, 0)))
    return _capped(findings)


def _frozen_but_changing(data: TrialData, facts: graphs.GraphFacts, training: pd.DataFrame, changed: dict[str, int],
                         nodes: dict[str, str]) -> list[Finding]:
    """Changes between two recorded training steps at both of which the parameter was frozen."""
    frozen: dict[str, set[int]] = {}
    for name, step in zip(training.loc[training["value"] == "False", "name"], training.loc[training["value"] == "False",
                                                                                          "training_step"]):
        frozen.setdefault(str(name), set()).add(int(step))
    for name, steps in _zero_learning_rate(data).items():
        frozen.setdefault(name, set()).update(steps)
    findings = []
    for name, step in sorted(_changes(data, frozen).items()):
        node = nodes.get(name, name)
        findings.append(Finding(
            detector="optimizer_groups", severity="warning", score=0.9, trial=data.trial, node=node, role=name,
            kind="forward", training_step=step, steps=[step],
            message=f"Parameter {name} is meant to be frozen (requires_grad=False or a learning rate of 0) but its "
                    f"value changes at step {step}: weight decay or momentum on stale gradients, another optimizer, "
                    "or a copy was frozen instead of the module. Leave frozen parameters out of the optimizer (or "
                    "set their .grad to None).",
            evidence={"problem": "frozen_but_changes"}, aggregation="none", column=facts.column.get(node, 0)))
    return _capped(findings)


def _zero_learning_rate(data: TrialData) -> dict[str, set[int]]:
    """Parameter -> the recorded training steps at which a group of learning rate 0 holds it."""
    rates = tables.runinfo_field(data, "optimizer_group", "lr")
    groups = tables.with_phase(data, tables.runinfo_field(data, "parameter", "optimizer_group"))
    if not len(rates) or not len(groups):
        return {}
    zero = {(int(r), int(s), str(n)) for r, s, n, v in zip(rates["rank"], rates["training_step"], rates["name"],
                                                            rates["number"]) if v == 0}
    found: dict[str, set[int]] = {}
    for rank, step, name, labels in zip(groups["rank"], groups["training_step"], groups["name"], groups["value"]):
        # Meant to be frozen: a group of learning rate 0 holds it (another optimizer may still step it: the bug).
        if labels and any((int(rank), int(step), label) in zero for label in str(labels).split(",")):
            found.setdefault(str(name), set()).add(int(step))
    return found


def _capped(findings: list[Finding]) -> list[Finding]:
    if len(findings) <= MAX_FINDINGS:
        return findings
    kept = findings[:MAX_FINDINGS]
    kept[-1].evidence["not_listed"] = [f.role for f in findings[MAX_FINDINGS:]]
    return kept

"""Parameters that never change, change without a gradient, or get a gradient and do not change,
and the size of their updates relative to their values."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.graphs import GraphFacts
from comgra.analysis.loading import TrialData
from comgra.store import format as fmt

MIN_UNITS_FOR_RATIO = 16
COMPARED = ["mean", "abs_mean", "std", "min", "max", "abs_max"]


@dataclass
class ParameterPart:
    """What the parameter detectors keep of one parameter over some steps: the size of each change between
    consecutive recorded steps and the size before it, and the first and last values (to join the change
    across the border of a streamed scan's windows)."""

    steps: np.ndarray
    changes: np.ndarray  # norm of the change between consecutive recorded steps
    norms: np.ndarray  # norm of the value before each change
    width: int
    changed: bool
    first: np.ndarray
    last: np.ndarray
    first_stats: np.ndarray | None  # the statistics of the first and last step (None: not one row per step)
    last_stats: np.ndarray | None
    gradient: float = 0.0  # the largest gradient seen

    def merge(self, later: ParameterPart) -> ParameterPart:
        width = min(self.width, later.width)
        change = float(np.linalg.norm(later.first[:width] - self.last[:width]))
        stats_changed = self.last_stats is not None and later.first_stats is not None and bool(
            np.abs(later.first_stats - self.last_stats).max() > 0)
        return ParameterPart(
            np.concatenate([self.steps, later.steps]), np.concatenate([self.changes, [change], later.changes]),
            np.concatenate([self.norms, [float(np.linalg.norm(self.last[:width]))], later.norms]), width,
            self.changed or later.changed or change > 0 or stats_changed, self.first, later.last,
            self.first_stats, later.last_stats, float(np.fmax(self.gradient, later.gradient)))


def detect(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    return judged(data, facts, options, parts(data))


def parts(data: TrialData) -> dict[tuple[str, str], ParameterPart]:
    """Per parameter, its part; computed once per trial's data (two detectors ask)."""
    found = getattr(data, "_parameter_parts", None)
    if found is None:
        found = _parts(data)
        data._parameter_parts = found  # type: ignore[attr-defined]
    return found


def _parts(data: TrialData) -> dict[tuple[str, str], ParameterPart]:
    rows = data.neurons["parameter"]
    if not len(rows.keys):
        return {}
    stats = data.stats
    values = stats[(stats["kind"] == fmt.FORWARD) & (stats["tensor_type"] == "parameter")]
    gradients = stats[(stats["kind"] != fmt.FORWARD) & (stats["tensor_type"] == "parameter")]
    gradient_size = gradients.groupby(["node", "role"], observed=True)["abs_max"].max()
    found = {}
    for (node, role), group in rows.keys.groupby(["node", "role"], sort=False, observed=True):
        group = group.sort_values("training_step").drop_duplicates("training_step")
        matrix = rows.matrix(group.index.to_numpy())
        own = values[(values["node"] == node) & (values["role"] == role)].drop_duplicates("training_step")
        own = own.sort_values("training_step")[COMPARED].to_numpy(np.float64)
        changes = np.linalg.norm(np.diff(matrix, axis=0), axis=1)
        one_per_step = len(own) == len(group)
        changed = (changes > 0) | (np.abs(np.diff(own, axis=0)).max(axis=1) > 0 if one_per_step and len(own) > 1
                                   else False)
        found[(str(node), str(role))] = ParameterPart(
            group["training_step"].to_numpy(np.int64), changes, np.linalg.norm(matrix[:-1], axis=1),
            int(matrix.shape[1]), bool(np.any(changed)), matrix[0], matrix[-1],
            own[0] if one_per_step else None, own[-1] if one_per_step else None,
            float(gradient_size.get((node, role), 0.0)))
    return found


def judged(data: TrialData, facts: GraphFacts, options: ScanOptions,
           found: dict[tuple[str, str], ParameterPart]) -> list[Finding]:
    findings = []
    for (node, role), part in found.items():
        if len(part.steps) < 2:
            continue
        finding = _finding(data, facts, node, role, part, options)
        if finding is not None:
            findings.append(finding)
    rounded = [f for f in findings if f.evidence.get("cause") == "rounding"]
    learning = sum(1 for part in found.values() if part.changed and len(part.steps) >= 2)
    if rounded and learning >= len(rounded):
        for finding in rounded:  # most parameters learn: the precision the run chose, not a broken run
            finding.severity, finding.score = "info", 0.5
    return findings


# Mantissa bits of the low-precision formats: a value v resolves steps of 2 ** (floor(log2 |v|) - bits).
MANTISSA_BITS = {"bfloat16": 7, "float16": 10}


def _runinfo_by_name(data: TrialData, field: str) -> dict[str, str]:
    """Parameter name -> the last recorded value of a runinfo field of it (empty where not recorded)."""
    key = f"_parameter_{field}"
    found = getattr(data, key, None)
    if found is None:
        from comgra.analysis import evidence_tables

        rows = evidence_tables.runinfo_field(data, "parameter", field)
        found = dict(zip(rows["name"].astype(str), rows["value"].astype(str))) if len(rows) else {}
        setattr(data, key, found)
    return found


def _zero_rate(data: TrialData, role: str) -> bool:
    """Whether every optimizer group that holds the parameter has a learning rate of 0 (its last recorded one)."""
    labels = [label for label in _runinfo_by_name(data, "optimizer_group").get(role, "").split(",") if label]
    if not labels:
        return False
    from comgra.analysis import evidence_tables

    rows = evidence_tables.runinfo_field(data, "optimizer_group", "lr")
    rates = dict(zip(rows["name"].astype(str), rows["number"].astype(float))) if len(rows) else {}
    return all(rates.get(label) == 0 for label in labels)


def _not_updated(role: str, gradient: float, span: str, part: ParameterPart, data: TrialData) -> tuple[str, dict]:
    """The cause the evidence supports for a parameter that gets a gradient and never changes: its updates rounded
    away in a low-precision format (where it is stored in one and, if known, is in the optimizer), or left out of
    the optimizer."""
    dtype = _runinfo_by_name(data, "dtype").get(role, "").removeprefix("torch.")
    groups = _runinfo_by_name(data, "optimizer_group")
    in_optimizer = None if not groups else bool(groups.get(role))
    values = np.abs(np.concatenate([part.first, part.last]))
    values = values[np.isfinite(values) & (values > 0)]
    if dtype in MANTISSA_BITS and in_optimizer is not False and len(values):
        size = float(np.median(values))
        resolution = 2.0 ** (np.floor(np.log2(size)) - MANTISSA_BITS[dtype])
        known = "it is in the optimizer, but " if in_optimizer else ""
        return (f"{role} gets a gradient (up to {gradient:.3g}) but never changes over {span}: {known}it is stored in "
                f"{dtype}, which at its values (about {size:.3g}) resolves steps of {resolution:.2g}; an update below "
                f"{resolution / 2:.2g} (an Adam step moves a parameter by about the learning rate) rounds back to the "
                f"old value. Keep float32 master weights (autocast, a mixed-precision optimizer, stochastic or "
                f"Kahan-compensated updates)" + ("." if in_optimizer else ", unless it is left out of the optimizer."),
                {"cause": "rounding", "dtype": dtype, "typical_value": size, "resolution": float(resolution),
                 "in_optimizer": in_optimizer})
    return (f"{role} gets a gradient (up to {gradient:.3g}) but never changes over {span}: is it left out of the "
            "optimizer?", {"cause": "not_in_optimizer" if in_optimizer is False else "unknown", "dtype": dtype or None})


def _finding(data: TrialData, facts: GraphFacts, node: str, role: str, part: ParameterPart,
             options: ScanOptions) -> Finding | None:
    steps = part.steps.astype(int).tolist()
    changes, changed, gradient = part.changes, part.changed, part.gradient
    base = dict(trial=data.trial, node=node, role=role, kind=fmt.FORWARD, training_step=steps[0], steps=steps,
                iteration=_first_iteration(data, steps[0]), aggregation="none", column=facts.column.get(node, 0))
    has_gradient = gradient > 0 and np.isfinite(gradient)
    span = f"steps {steps[0]} to {steps[-1]} ({len(steps)} recorded)"
    if not changed and has_gradient and _zero_rate(data, role):
        return Finding(detector="parameter_frozen", severity="info", score=0.5, statistic="mean",
                       message=f"{role} never changes over {span}: every optimizer group that holds it has a learning "
                               "rate of 0 (frozen on purpose).", evidence={"steps": len(steps), "cause": "lr_0"},
                       **base)
    if not changed and has_gradient:
        message, cause = _not_updated(role, gradient, span, part, data)
        return Finding(detector="parameter_not_updated", severity="warning", score=0.9, statistic="mean",
                       message=message, evidence={"max_gradient": gradient, "steps": len(steps), **cause}, **base)
    if not changed:
        return Finding(detector="parameter_frozen", severity="info", score=0.5, statistic="mean",
                       message=f"{role} never changes over {span} and gets no gradient: frozen.",
                       evidence={"steps": len(steps)}, **base)
    if not has_gradient:
        return Finding(detector="parameter_changes_without_gradient", severity="warning", score=0.8,
                       statistic="mean",
                       message=f"{role} changes over {span} although it never gets a gradient: something other "
                               "than the optimizer writes to it (weight decay alone, an in-place update, a reset?).",
                       evidence={"steps": len(steps), "largest_change": float(changes.max())}, **base)
    return _update_ratio(part, steps, options, base, role)


def _update_ratio(part: ParameterPart, steps: list[int], options: ScanOptions, base: dict,
                  role: str) -> Finding | None:
    if part.width < MIN_UNITS_FOR_RATIO:
        return None  # a bias of a few values near zero has a huge relative change and means nothing
    norms, changes = part.norms, part.changes
    gaps = np.maximum(np.diff(np.asarray(steps, dtype=np.float64)), 1.0)
    valid = norms > 0
    if not valid.any():
        return None
    ratio = float(np.median(changes[valid] / norms[valid] / gaps[valid]))
    high, low = options.scaled(options.update_ratio_high), options.update_ratio_low * options.sensitivity
    if ratio > high:
        return Finding(detector="update_ratio", severity="warning", score=min(1.0, ratio / (10 * high)),
                       statistic="abs_max",
                       message=f"The updates of {role} are large: each training step changes it by {ratio:.2g} of "
                               f"its size (median; usually about 1e-3). The learning rate may be too high.",
                       evidence={"update_to_weight_ratio": ratio, "pairs": int(valid.sum())}, **base)
    if 0 < ratio < low:
        return Finding(detector="update_ratio", severity="info", score=0.3, statistic="abs_max",
                       message=f"The updates of {role} are tiny: each training step changes it by {ratio:.2g} of its "
                               "size (median; usually about 1e-3). Is it learning?",
                       evidence={"update_to_weight_ratio": ratio, "pairs": int(valid.sum())}, **base)
    return None


def _first_iteration(data: TrialData, step: int) -> int:
    iterations = data.steps.loc[data.steps["training_step"] == step, "iteration"]
    return int(iterations.min()) if len(iterations) else 0

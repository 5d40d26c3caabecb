"""What the every-step sentinels saw between the recorded steps (the ``sentinels`` table).

- *An error on a step the policy did not record*: the first NaN or infinity of a loss or output, an empty
  batch. Where inside the step it began is not known (no tensor of that step was kept), so it is said
  plainly, and the ``non_finite`` findings of the recorded steps after it are no longer taken for its origin
  (``reattribute``): on those steps the parameters may already hold the NaN, which made the first
  recorded NaN look born in a parameter.
- *An input that collapses on some steps*: an input or target (a collate function or a transform that zeroes the
  batch, labels all set to one value or to ignore_index, an attention mask all zeros) that is constant within the
  step (its smallest value is its largest) on a minority of the steps, while on most steps it varies, or holds
  another constant (an all-ones mask of unpadded batches is the norm, an all-zeros one is not). An input constant
  on most steps, with a value that changes from step to step (a diffusion timestep), is constant by design.
- *A transient scale jump*: a step whose largest magnitude is orders above its neighbours' on both sides
  (logits that jump to 1e5 for one evaluation pass against 5-10 elsewhere), judged per tensor and type of
  execution against a running median, so that a loss falling during training is no jump; and above the highest
  level the running median reaches anywhere in the run (a loss converged to 1e-7 that comes back to 3e-3 for a
  step is still far below where it started: no jump).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from comgra.analysis import evidence_tables as tables
from comgra.analysis import graphs
from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.loading import TrialData

NON_FINITE = ("nan", "inf")
JUMP_ORDERS = 2.0  # a jump is at least this many powers of ten above the running median
NEIGHBOUR_ORDERS = 1.0  # and this many above the steps just before and after it
WINDOW = 11
MIN_POINTS = 10
MAX_JUMP_FRACTION = 0.05  # more jumping steps than this is the series' nature, not a transient
MIN_ELEMENTS = 16  # an input of fewer elements can be constant by chance (8 binary labels: 1 step in 128)


def detect(data: TrialData, facts: graphs.GraphFacts, options: ScanOptions) -> list[Finding]:
    sentinels = tables.table(data, "sentinels")
    if not len(sentinels):
        return []
    return (_non_finite(data, facts, sentinels) + _empty(data, facts, sentinels) + _collapsed(data, facts, sentinels)
            + _jumps(data, facts, sentinels, options))


def first_unrecorded_non_finite(data: TrialData) -> int | None:
    """The first step with a non-finite sentinel, if the policy did not record it; else None."""
    sentinels = tables.table(data, "sentinels")
    if not len(sentinels):
        return None
    bad = sentinels[sentinels["event"].isin(list(NON_FINITE))]
    if not len(bad):
        return None
    first = bad[bad["training_step"] == bad["training_step"].min()]
    return None if bool(first["recorded"].any()) else int(first["training_step"].iloc[0])


def _non_finite(data: TrialData, facts: graphs.GraphFacts, sentinels: pd.DataFrame) -> list[Finding]:
    step = first_unrecorded_non_finite(data)
    if step is None:
        return []
    bad = sentinels[sentinels["event"].isin(list(NON_FINITE))]
    at = bad[bad["training_step"] == step]
    # Earliest in the graph first; of two in one column, the output before the loss it feeds.
    names = sorted(set(at["name"].astype(str)), key=lambda n: (facts.column.get(n, 0), facts.is_loss_like(n), n))
    recorded = sentinels.loc[sentinels["recorded"], "training_step"]
    before, after = recorded[recorded < step], recorded[recorded > step]
    what = "NaN" if (at["event"] == "nan").any() else "infinite value"
    clean = f"the last recorded step before it, {int(before.max())}, was finite" if len(before) else \
        "no step before it was recorded"
    later = f"the first recorded step after it is {int(after.min())}" if len(after) else "no step after it was recorded"
    steps = sorted({int(s) for s in bad["training_step"]})
    return [Finding(
        detector="sentinel_events", severity="error", score=1.0, trial=data.trial, node=names[0], role=names[0],
        kind="forward", training_step=step, steps=steps,
        message=f"First {what} at training step {step}, in {', '.join(names)}: a step the policy did not record, so "
                f"where it began inside the step is not known ({clean}; {later}, and what it shows there may be the "
                f"NaN's consequence, not its origin). Record that step: a breakpoint 'has_nan > 0' on {names[0]!r}, "
                "or set_sentinels(pause_on_error=True).",
        evidence={"problem": "non_finite_on_unrecorded_step", "tensors": names, "steps_with_non_finite": len(steps)},
        statistic="abs_max", column=facts.column.get(names[0], 0))]


def _empty(data: TrialData, facts: graphs.GraphFacts, sentinels: pd.DataFrame) -> list[Finding]:
    findings = []
    for event, severity, words in (("zero_batch", "error", "an empty batch (batch size 0)"),
                                   ("empty", "warning", "a tensor without elements")):
        rows = sentinels[sentinels["event"] == event]
        if not len(rows):
            continue
        step, name = int(rows["training_step"].min()), str(rows["name"].iloc[0])
        findings.append(Finding(
            detector="sentinel_events", severity=severity, score=0.9, trial=data.trial, node=name, role=None,
            kind=None, training_step=step, steps=sorted({int(s) for s in rows["training_step"]}),
            message=f"Training step {step} had {words} ({name}; {rows['training_step'].nunique()} step(s) in all): "
                    "a data loader or filter that can leave nothing, or a slice off by one.",
            evidence={"problem": event}, column=facts.column.get(name, 0)))
    return findings


def _jumps(data: TrialData, facts: graphs.GraphFacts, sentinels: pd.DataFrame, options: ScanOptions) -> list[Finding]:
    rows = sentinels[~sentinels["source"].isin(["batch", "input"]) & sentinels["event"].isna()]
    findings = []
    for (name, kind, rank), group in rows.groupby(["name", "type_of_execution", "rank"], sort=True, observed=True,
                                                  dropna=False):
        ordered = group.sort_values("training_step")
        magnitude = ordered["abs_max"].to_numpy(dtype=np.float64)
        keep = np.isfinite(magnitude) & (magnitude > 0)
        if keep.sum() < MIN_POINTS:
            continue
        steps, logs = ordered["training_step"].to_numpy()[keep], np.log10(magnitude[keep])
        running = pd.Series(logs).rolling(WINDOW, center=True, min_periods=3).median().to_numpy()
        previous, following = np.r_[logs[:1], logs[:-1]], np.r_[logs[1:], logs[-1:]]
        jump = (logs - running >= options.orders(JUMP_ORDERS)) & (logs - np.maximum(previous, following) >=
                                                                 options.orders(NEIGHBOUR_ORDERS))
        jump &= logs > np.nanmax(running)  # above any level the series held: a loss near 0 back at 1e-3 is no jump
        if not jump.any() or jump.sum() > max(1, MAX_JUMP_FRACTION * len(logs)):
            continue
        at = int(np.argmax(np.where(jump, logs - running, -np.inf)))
        findings.append(Finding(
            detector="sentinel_events", severity="warning", score=min(1.0, 0.5 + (logs[at] - running[at]) / 10),
            trial=data.trial, node=str(name), role=str(name), kind="forward", training_step=int(steps[at]),
            steps=[int(s) for s in steps[jump]],
            message=f"The largest magnitude of {name} jumps to {10 ** logs[at]:.3g} at step {int(steps[at])} "
                    f"({kind}), against about {10 ** running[at]:.3g} on the steps around it: a transient scale jump "
                    f"on {int(jump.sum())} step(s) (an unnormalised batch, a learning-rate spike, a bad sample).",
            evidence={"problem": "transient_jump", "abs_max": float(10 ** logs[at]),
                      "running_median": float(10 ** running[at]), "rank": int(rank)},
            statistic="abs_max", column=facts.column.get(str(name), 0)))
    return findings


def reattribute(data: TrialData, findings: list[Finding]) -> list[Finding]:
    """``non_finite`` findings of recorded steps after a NaN that was born on an unrecorded step show where the
    NaN is on the first recorded step, not where it began: no longer an origin, at most a warning."""
    step = first_unrecorded_non_finite(data)
    if step is None:
        return findings
    for finding in findings:
        if finding.detector == "non_finite" and finding.training_step is not None and finding.training_step > step:
            finding.origin = False
            finding.severity = "warning" if finding.severity == "error" else finding.severity
            finding.score = min(finding.score, 0.5)
            finding.message += (f" The sentinels saw the first non-finite value earlier, at step {step}, which was not "
                                "recorded: this is where it shows, not necessarily where it began.")
            finding.evidence["born_on_unrecorded_step"] = step
    return findings


def _collapsed(data: TrialData, facts: graphs.GraphFacts, sentinels: pd.DataFrame) -> list[Finding]:
    if "value_min" not in sentinels.columns:
        return []  # a recording from before the sentinels kept the smallest and largest value
    rows = sentinels[(sentinels["source"] == "input") & sentinels["event"].isna() &
                     (sentinels["numel"] >= MIN_ELEMENTS)]
    findings = []
    for (name, kind, rank), group in rows.groupby(["name", "type_of_execution", "rank"], sort=True, observed=True,
                                                  dropna=False):
        group = group[np.isfinite(group["value_min"].to_numpy(dtype=np.float64)) &
                      np.isfinite(group["value_max"].to_numpy(dtype=np.float64))].sort_values("training_step")
        if len(group) < MIN_POINTS:
            continue
        low, high = group["value_min"].to_numpy(dtype=np.float64), group["value_max"].to_numpy(dtype=np.float64)
        constant = low == high
        bad = _collapsed_steps(constant, high)
        if not bad.any() or bad.sum() > len(group) / 2:
            continue
        steps = [int(s) for s in group["training_step"].to_numpy()[bad]]
        values = sorted({float(v) for v in high[bad]})
        unrecorded = int((~group["recorded"].to_numpy(dtype=bool)[bad]).sum())
        what = "all zeros" if values == [0.0] else f"constant ({', '.join(f'{v:g}' for v in values[:3])})"
        usual = "varies" if (~constant).mean() >= 0.5 else f"is {high[~bad][0]:g} throughout"
        findings.append(Finding(
            detector="sentinel_events", severity="warning", score=0.85, trial=data.trial, node=str(name),
            role=str(name), kind="forward", training_step=steps[0], steps=steps,
            message=f"The input {name} is {what} on {len(steps)} of {len(group)} steps ({kind}; first at step "
                    f"{steps[0]}, {unrecorded} of them not recorded), while on the other steps it {usual}: the model "
                    "sees no signal there. A collate function or transform that zeroes the batch, labels all set to one "
                    "value or to ignore_index, or an attention mask of zeros.",
            evidence={"problem": "input_collapsed", "values": values, "steps_collapsed": len(steps),
                      "steps_unrecorded": unrecorded, "rank": int(rank)},
            statistic="abs_max", column=facts.column.get(str(name), 0)))
    return findings


def _collapsed_steps(constant: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Which steps collapsed: constant, where the input varies on most steps (unless at the largest value the
    varying steps reach and not zero: an unpadded batch's all-ones mask), or at another value than the constant
    most steps hold."""
    if (~constant).mean() >= 0.5:
        return constant & ((value != value[~constant].max()) | (value == 0))
    values, counts = np.unique(value[constant], return_counts=True)
    if counts.max() < len(value) / 2:
        return np.zeros_like(constant)  # constant within each step by design, its value changing (a timestep)
    return constant & (value != values[np.argmax(counts)])

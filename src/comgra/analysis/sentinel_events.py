"""What the every-step sentinels saw between the recorded steps (the ``sentinels`` table).

- *An error on a step the policy did not record*: the first NaN or infinity of a loss or output, an empty
  batch. Where inside the step it began is not known (no tensor of that step was kept), so it is said
  plainly, and the ``non_finite`` findings of the recorded steps after it are no longer taken for its origin
  (``reattribute``): on those steps the parameters may already hold the NaN, which made the first
  recorded NaN look born in a parameter.
- *A transient scale jump*: a step whose largest magnitude is orders above its neighbours' on both sides
  (logits that jump to 1e5 for one evaluation pass against 5-10 elsewhere), judged per tensor and type of
  execution against a running median, so that a loss falling during training is no jump.
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


def detect(data: TrialData, facts: graphs.GraphFacts, options: ScanOptions) -> list[Finding]:
    sentinels = tables.table(data, "sentinels")
    if not len(sentinels):
        return []
    return _non_finite(data, facts, sentinels) + _empty(data, facts, sentinels) + _jumps(data, facts, sentinels, options)


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
    rows = sentinels[(sentinels["source"] != "batch") & sentinels["event"].isna()]
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

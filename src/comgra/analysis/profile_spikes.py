"""Sudden slowdowns and memory spikes per layer, from the profiling table (``track_module(..., profile=True)``).

Per module, its time per step (forward and backward, summed over its calls in the step) and its CUDA
allocation growth per step are compared with the module's own running median over the steps around:

- a *spike*: one step (or a few) far above the steps on both sides: a step that waited on something (a
  synchronisation, a recompilation, the data loader) or allocated a temporary far larger than usual;
- a *slowdown*: the module's last quarter of steps takes much longer than its first (after warm-up) and
  stays so: memory fragmentation, a cache that grows, a shape that grows.

The first steps (warm-up: allocation, autotuning, lazy initialisation) are left out. Times are noisy on a
shared machine, so a time spike is information; a slowdown and a memory spike are warnings.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from comgra.analysis import evidence_tables as tables
from comgra.analysis import graphs
from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.loading import TrialData

WARM_UP_STEPS = 3
MIN_STEPS = 12
WINDOW = 9
SPIKE_RATIO = 5.0  # a spike is this many times the running median
MIN_SPIKE_SECONDS = 5e-3  # and at least this much longer (a stall: the OS's preemptions are shorter)
SLOWDOWN_RATIO = 3.0  # the last quarter's median over the first quarter's
MIN_SLOWDOWN_SECONDS = 5e-3
MEMORY_RATIO = 4.0
MIN_MEMORY_BYTES = 64 << 20
MAX_SPIKE_FRACTION = 0.05  # more spiking steps than this (and than MAX_SPIKES) is the module's nature, not a spike
MAX_SPIKES = 3


def detect(data: TrialData, facts: graphs.GraphFacts, options: ScanOptions) -> list[Finding]:
    layers = tables.table(data, "layers")
    if not len(layers):
        return []
    findings: list[Finding] = []
    # A step is (training_step, type_of_execution): an evaluation that shares a training step's number is a step of
    # its own, compared only with the steps of its type (null: a recording from before layers carried the type).
    kinds = layers["type_of_execution"].fillna("") if "type_of_execution" in layers else ""
    times = layers.assign(seconds=layers["forward_time"].fillna(0) + layers["backward_time"].fillna(0), kind=kinds)
    per_step = times.groupby(["rank", "module", "kind", "training_step"], observed=True).agg(
        seconds=("seconds", "sum"), memory=("cuda_allocated_delta", "max")).reset_index()
    for (rank, module, kind), group in per_step.groupby(["rank", "module", "kind"], sort=True, observed=True):
        ordered = group.sort_values("training_step").iloc[WARM_UP_STEPS:]
        if len(ordered) < MIN_STEPS:
            continue
        steps = ordered["training_step"].to_numpy()
        where = {"rank": int(rank), **({"type_of_execution": str(kind)} if kind else {})}
        found = _spikes(data, str(module), steps, ordered["seconds"].to_numpy(np.float64), "time")
        memory = ordered["memory"].to_numpy(np.float64)
        if np.isfinite(memory).sum() >= MIN_STEPS:
            found += _spikes(data, str(module), steps, np.nan_to_num(memory), "memory")
        found += _slowdown(data, str(module), steps, ordered["seconds"].to_numpy(np.float64))
        for finding in found:
            finding.evidence.update(where)
        findings += found
    return _innermost(findings)


def _innermost(findings: list[Finding]) -> list[Finding]:
    """A module's time contains its submodules': a spike or slowdown that a submodule shows too is the submodule's."""
    def key(finding: Finding) -> tuple[str, int | None, int, str | None]:
        evidence = finding.evidence
        return evidence["problem"], finding.training_step, evidence["rank"], evidence.get("type_of_execution")
    shown = {(f.node, key(f)) for f in findings}
    return [f for f in findings if not any(node.startswith(f.node + ".") and k == key(f) for node, k in shown)]


def _spikes(data: TrialData, module: str, steps: np.ndarray, values: np.ndarray, what: str) -> list[Finding]:
    running = pd.Series(values).rolling(WINDOW, center=True, min_periods=3).median().to_numpy()
    previous, following = np.r_[values[:1], values[:-1]], np.r_[values[1:], values[-1:]]
    ratio, floor = (SPIKE_RATIO, MIN_SPIKE_SECONDS) if what == "time" else (MEMORY_RATIO, MIN_MEMORY_BYTES)
    spike = (values > ratio * np.maximum(running, 0)) & (values - running > floor) & \
        (values > np.maximum(previous, following))
    if not spike.any() or spike.sum() > max(MAX_SPIKES, MAX_SPIKE_FRACTION * len(values)):
        return []
    ratios = np.where(spike, values / np.maximum(running, 1e-12), -np.inf)
    at = int(np.argmax(ratios))
    if what == "time":
        message = (f"{module} took {values[at] * 1e3:.3g} ms at step {int(steps[at])}, against {running[at] * 1e3:.3g} "
                   f"ms on the steps around it: a sudden slowdown on {int(spike.sum())} step(s).")
    else:
        message = (f"{module} allocated {values[at] / 2**20:.4g} MiB more CUDA memory at step {int(steps[at])} than "
                   f"before it, against {running[at] / 2**20:.4g} MiB on the steps around it: a memory spike.")
    score = float(min(1.0, 0.5 + np.log10(ratios[at]) / 4))  # the bigger the jump, the surer: 50x scores 0.92
    return [Finding(detector="profile_spikes", severity="info" if what == "time" else "warning", score=score,
                    trial=data.trial, node=module, role=None, kind=None, training_step=int(steps[at]),
                    steps=[int(s) for s in steps[spike]], message=message,
                    evidence={"problem": f"{what}_spike", "value": float(values[at]),
                              "running_median": float(running[at])})]


def _slowdown(data: TrialData, module: str, steps: np.ndarray, seconds: np.ndarray) -> list[Finding]:
    quarter = len(seconds) // 4
    first, last = float(np.median(seconds[:quarter])), float(np.median(seconds[-quarter:]))
    if last < SLOWDOWN_RATIO * first or last - first < MIN_SLOWDOWN_SECONDS:
        return []
    step = int(steps[-quarter])
    return [Finding(detector="profile_spikes", severity="warning", score=0.7, trial=data.trial, node=module, role=None,
                    kind=None, training_step=step, steps=[int(s) for s in steps[-quarter:]],
                    message=f"{module} slowed down: {last * 1e3:.3g} ms per step over the last quarter of the steps, "
                            f"{first * 1e3:.3g} ms over the first (after warm-up), {last / max(first, 1e-12):.1f}x.",
                    evidence={"problem": "slowdown", "first_quarter_seconds": first, "last_quarter_seconds": last})]

"""Every detector, by name, and how they run over one trial.

Importing this module loads pandas, scipy and scikit-learn (seconds): ``comgra.analysis.scan``
imports it only when a trial really has to be scanned, so that findings saved in the recording
are answered without it.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from comgra.analysis import (cooccurrence, correlation, curves, custom, evidence_detectors, graphs, nonfinite, outliers,
                             parameters, structure, trends, unit_patterns, units, updates)
from comgra.analysis.detectors_names import BUILT_IN
from comgra.analysis.findings import Finding, ScanOptions, rank_findings, summarised
from comgra.analysis.loading import TrialData
from comgra.errors import SelectionError

log = logging.getLogger("comgra.analysis")
Detector = Callable[[TrialData, graphs.GraphFacts, ScanOptions], list[Finding]]
DETECTORS: dict[str, Detector] = {
    "non_finite": lambda data, facts, options: nonfinite.detect(data, facts),
    "gradients": trends.gradients,
    "growth": trends.growth,
    "collapse": trends.collapse,
    "dead_units": units.dead,
    "saturated_units": units.saturated,
    "one_sided": units.one_sided,
    "parameters": parameters.detect,
    "outliers": outliers.detect,
    "correlation": correlation.detect,
    **evidence_detectors.EVIDENCE,  # the evidence beside the tensors: runinfo, sentinels, the profiling table
    "loss_curve": curves.loss_curve,
    "constant_data": curves.constant_data,
    "transient_jumps": curves.transient_jumps,
    "output_range": curves.output_range,
    "probabilities_to_loss": curves.probabilities_to_loss,
    "updates": updates.updates,
    "stale_gradients": updates.stale_gradients,
    "shapes": structure.shapes,
    "growth_within_step": structure.growth_within_step,
    "growth_along_edges": structure.growth_along_edges,
    "detached": structure.detached,
    "dying_units": unit_patterns.dying,
    "identical_units": unit_patterns.identical,
    "sparse_units": unit_patterns.sparse,
}
assert set(DETECTORS) | {"co_occurrence"} == BUILT_IN, "detectors_names.BUILT_IN lists every built-in detector"
# The detectors a streamed scan (a trial too big for memory, ``comgra.analysis.streaming``) runs too; the others read
# the whole trial at once.
STREAMED = ("non_finite", "gradients", "growth", "collapse", "dead_units", "saturated_units", "one_sided", "parameters",
            "outliers", "correlation", *evidence_detectors.EVIDENCE)


def detect_all(data: TrialData, options: ScanOptions) -> tuple[list[Finding], list[str]]:
    """Every detector over one trial; a detector that fails is reported and the others still run."""
    facts = graphs.facts(data.graphs.values())
    if options.target is not None:
        correlation.pick_target(data, facts, options.target)  # an unknown --target is the user's error
    findings: list[Finding] = []
    problems = [f"skipped {p}" for p in data.problems]
    if not len(data.stats):
        return findings, problems
    for name, detector in {**DETECTORS, **custom.registered()}.items():
        try:
            findings.extend(detector(data, facts, options))
        except SelectionError:
            raise
        except Exception as error:  # noqa: BLE001 - one detector's fault must not hide the others' findings
            log.debug("comgra: detector %s failed", name, exc_info=error)
            problems.append(f"detector {name} failed on trial {data.trial!r}: {type(error).__name__}: {error}")
    findings = evidence_detectors.sentinel_events.reattribute(data, findings)  # a NaN born on an unrecorded step: not blamed on a node
    findings.extend(cooccurrence.detect(findings, int(data.steps["training_step"].nunique())))
    learning, moving = learning_of(paces_of(parameters.parts(data)), facts)
    return rank_findings(explained(findings, updates.loss_fall(data), learning, moving)), problems


LEARNS = 0.1  # a parameter whose relative updates are at least this share of the model's median ones learns
MOVING_SHARE = 0.5  # a loss that holds while most of the parameters learn is at its level, not stuck
LEARNING_PACE = updates.TINY_UPDATE  # ... or at least this share of its size per step (below it: far too small)


def paces_of(parts: dict[tuple[str, str], parameters.ParameterPart]) -> dict[str, float]:
    """Trained parameter node -> its median relative change per step (``updates.pace``), where it has one; a
    parameter without a gradient (a frozen base under LoRA) is not among those that should learn."""
    return {node: pace for (node, _role), part in parts.items()
            if part.gradient > 0 and (pace := updates.pace(part)) is not None}


def learning_of(paces: dict[str, float], facts: graphs.GraphFacts) -> tuple[dict[str, bool], float | None]:
    """Node -> whether it learns at the pace of the rest of the model: a parameter whose median relative update per
    step is at least ``LEARNS`` of the median over all parameters (or ``LEARNING_PACE``), or a tensor computed
    directly from parameters that all do. And the share of the parameters that learn so, where the median parameter
    moves at least ``LEARNING_PACE`` of its size per step (0 where it does not; None without parameters). An adaptive optimizer (Adam) sizes a step by the gradient's own history, so a small gradient can move its
    parameter as much as any other."""
    if not paces:
        return {}, None
    typical = float(np.median(list(paces.values())))
    limit = min(LEARNS * typical, LEARNING_PACE)
    learns = {node: pace >= limit for node, pace in paces.items()}
    # The model as a whole moves at a learning pace, and this share of its parameters with it.
    moving = sum(learns.values()) / len(paces) if typical >= LEARNING_PACE else 0.0
    for node in facts.learned:
        sources = [s for s, targets in facts.feeds.items() if node in targets and s in paces]
        if sources and node not in paces:
            learns[node] = all(paces[s] >= limit for s in sources)
    return learns, moving


LOSS_SYMPTOMS = ("loss_not_decreasing", "loss_stuck")  # consequences: another warning may say why
COLLAPSE_CAUSES = ("dead_units", "parameter_shrinking", "identical_units")


CONVERGED_FALL = 1000.0  # a loss this many times below its start: gradients that vanish have nothing left to learn


def explained(findings: list[Finding], loss_fall: float | None = None,
              learning: dict[str, bool] | None = None, moving: float | None = None) -> list[Finding]:
    """Findings that are true by construction lowered to info: a bias whose gradient vanishes while the weight of its
    own layer learns (a bias before a normalisation, a key bias under softmax); and consequences ranked below their
    causes: a loss that does not decrease where another warning says why (lowered to info), a batch spread that
    collapses where units die or weights shrink (no longer an origin); gradients that vanish once the loss has fallen
    three orders of magnitude (to info: a converged loss has small gradients). Then findings that repeat over many
    tensors are folded into one per cause (``findings.summarised``)."""
    for finding in findings:  # a small gradient is a problem where it stops learning, not where Adam rescales it
        if finding.detector == "vanishing_gradient" and finding.severity == "warning" and (learning or {}).get(
                finding.node):
            finding.severity = "info"
            finding.message += (" Its updates are of the same size as the rest of the model's all the same (the "
                                "optimizer scales each step by the gradient's own history): it learns.")
    vanished = {f.node for f in findings if f.detector == "vanishing_gradient" and f.severity == "warning"}
    for finding in findings:
        node = finding.node
        if finding.detector == "vanishing_gradient" and node.endswith(".bias") and \
                node.removesuffix(".bias") + ".weight" not in vanished and finding.severity == "warning":
            finding.severity = "info"
            finding.message += (" Its layer's weight gets a normal gradient: a bias whose gradient is zero by "
                                "construction (followed by a normalisation, or a key bias under softmax) is harmless.")
    if loss_fall is not None and loss_fall >= CONVERGED_FALL:
        for finding in findings:
            per_step = finding.detector == "vanishing_gradient" or (
                finding.detector == "exploding_gradient" and "median_gradient" in finding.evidence)
            if per_step and finding.severity == "warning":
                finding.severity = "info"
                finding.message += (f" The loss has fallen {loss_fall:.3g}x since the start of the run: the "
                                    "gradients of a converged loss are small, those of its last layers relatively "
                                    "large.")
    # A batch spread that collapses where (or after) units die or weights shrink is their consequence.
    upstream = [f for f in findings if f.severity == "warning" and f.detector in COLLAPSE_CAUSES]
    for finding in findings:
        if finding.detector == "collapse" and any(c.column <= finding.column for c in upstream):
            finding.origin = False
    if moving is not None and moving >= MOVING_SHARE:
        for finding in findings:  # the parameters do change at a learning pace: the loss is at its level already
            if finding.detector == "loss_not_decreasing" and finding.severity == "warning":
                finding.severity = "info"
                finding.message += (f" Yet {moving:.0%} of the parameters change at a learning pace (the median "
                                    f"one by at least {LEARNING_PACE:g} of its size per step): a loss that holds its level while the model learns is "
                                    "a pretrained model fine-tuned gently, a converged run, or a plateau before the "
                                    "loss falls; look again if it stays there.")
    causes = [f for f in findings if f.severity in ("error", "warning") and f.detector not in LOSS_SYMPTOMS]
    for finding in findings:
        if finding.detector in LOSS_SYMPTOMS and causes:
            finding.severity = "info"
            finding.origin = False
            finding.message += f" Other findings say why (e.g. {causes[0].detector} at {causes[0].node})."
    return summarised(rank_findings(findings))  # one finding per cause, not per tensor

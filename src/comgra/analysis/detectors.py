"""Every detector, by name, and how they run over one trial.

Importing this module loads pandas, scipy and scikit-learn (seconds): ``comgra.analysis.scan``
imports it only when a trial really has to be scanned, so that findings saved in the recording
are answered without it.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from comgra.analysis import cooccurrence, correlation, graphs, nonfinite, outliers, parameters, trends, units
from comgra.analysis import evidence_detectors
from comgra.analysis.findings import Finding, ScanOptions, rank_findings
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
}


def detect_all(data: TrialData, options: ScanOptions) -> tuple[list[Finding], list[str]]:
    """Every detector over one trial; a detector that fails is reported and the others still run."""
    facts = graphs.facts(data.graphs.values())
    if options.target is not None:
        correlation.pick_target(data, facts, options.target)  # an unknown --target is the user's error
    findings: list[Finding] = []
    problems = [f"skipped {p}" for p in data.problems]
    if not len(data.stats):
        return findings, problems
    for name, detector in DETECTORS.items():
        try:
            findings.extend(detector(data, facts, options))
        except SelectionError:
            raise
        except Exception as error:  # noqa: BLE001 - one detector's fault must not hide the others' findings
            log.debug("comgra: detector %s failed", name, exc_info=error)
            problems.append(f"detector {name} failed on trial {data.trial!r}: {type(error).__name__}: {error}")
    findings = evidence_detectors.sentinel_events.reattribute(data, findings)  # a NaN born on an unrecorded step: not blamed on a node
    findings.extend(cooccurrence.detect(findings, int(data.steps["training_step"].nunique())))
    return rank_findings(findings), problems

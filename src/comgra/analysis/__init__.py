"""Findings: anomaly detectors and correlation hints over a recording, as plain data. No torch.

    >>> from comgra.analysis import Scanner, ScanOptions           # doctest: +SKIP
    >>> result = Scanner().scan("runs/my_group", options=ScanOptions(sensitivity=2))  # doctest: +SKIP
    >>> scans = [scan_trial("runs/sweep", t) for t in trial_ids("runs/sweep")]  # doctest: +SKIP

``scan_trial`` is the unit a distributed engine maps over the trials of a sweep (docs/sweeps.md).

The detectors need pandas, scipy and scikit-learn, which take seconds to import: they are loaded
when a scan is first asked for, so that the app starts without them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from comgra.analysis.custom import register_detector, unregister_detector
from comgra.analysis.findings import FORMAT_VERSION, SEVERITIES, Finding, ScanOptions, document, rank_findings

if TYPE_CHECKING:
    from comgra.analysis.scan import DETECTORS, ScanResult, Scanner, detect_all
    from comgra.analysis.sweep import TrialScan, scan_trial, trial_ids

__all__ = ["DETECTORS", "FORMAT_VERSION", "SEVERITIES", "Finding", "ScanOptions", "ScanResult", "Scanner",
           "TrialScan", "detect_all", "document", "rank_findings", "register_detector", "scan_trial", "trial_ids",
           "unregister_detector"]
_FROM_SCAN = ("DETECTORS", "ScanResult", "Scanner", "detect_all")
_FROM_SWEEP = ("TrialScan", "scan_trial", "trial_ids")  # the scan of a sweep as a map over its trials


def __getattr__(name: str) -> Any:
    if name in _FROM_SCAN:
        from comgra.analysis import scan

        return getattr(scan, name)
    if name in _FROM_SWEEP:
        from comgra.analysis import sweep

        return getattr(sweep, name)
    raise AttributeError(f"module 'comgra.analysis' has no attribute {name!r}")

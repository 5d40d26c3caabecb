"""Findings: anomaly detectors and correlation hints over a recording, as plain data. No torch.

    >>> from comgra.analysis import Scanner, ScanOptions           # doctest: +SKIP
    >>> result = Scanner().scan("runs/my_group", options=ScanOptions(sensitivity=2))  # doctest: +SKIP

The detectors need pandas, scipy and scikit-learn, which take seconds to import: they are loaded
when a scan is first asked for, so that the app starts without them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from comgra.analysis.custom import register_detector, unregister_detector
from comgra.analysis.findings import FORMAT_VERSION, SEVERITIES, Finding, ScanOptions, document, rank_findings

if TYPE_CHECKING:
    from comgra.analysis.scan import DETECTORS, ScanResult, Scanner, detect_all

__all__ = ["DETECTORS", "FORMAT_VERSION", "SEVERITIES", "Finding", "ScanOptions", "ScanResult", "Scanner",
           "detect_all", "document", "rank_findings", "register_detector", "unregister_detector"]
_FROM_SCAN = ("DETECTORS", "ScanResult", "Scanner", "detect_all")


def __getattr__(name: str) -> Any:
    if name in _FROM_SCAN:
        from comgra.analysis import scan

        return getattr(scan, name)
    raise AttributeError(f"module 'comgra.analysis' has no attribute {name!r}")

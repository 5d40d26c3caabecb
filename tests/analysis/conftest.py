"""Fixtures shared by the analysis tests."""
from __future__ import annotations

import pytest

from comgra.analysis import scan


@pytest.fixture
def counted_scans(monkeypatch):
    """The trials whose detectors really ran (a scan, not saved findings), in order."""
    ran: list[str] = []
    original = scan.detect_all
    monkeypatch.setattr(scan, "detect_all", lambda data, options: ran.append(data.trial) or original(data, options))
    return ran

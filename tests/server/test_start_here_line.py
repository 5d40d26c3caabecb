"""The Start here line says where the scan stands until there is a finding to start from (its line is there from the
page's first drawing, so that the strip moves nothing when it comes): the texts for each state, and the strip."""
from __future__ import annotations

from comgra.analysis.findings import Finding
from comgra.server import start_here
from comgra.service.findings import FindingsProgress


def _text(component) -> str:
    if isinstance(component, str):
        return component
    children = getattr(component, "children", None)
    if isinstance(children, (list, tuple)):
        return " ".join(_text(child) for child in children)
    return "" if children is None else _text(children)


def _finding(severity: str) -> Finding:
    return Finding(detector="nonfinite", severity=severity, score=1.0, trial="t", node="layer.out", role="layer.out",
                   kind="forward", training_step=3,
                   statistic="max", message="the values became NaN at step 3")


def test_each_state_has_its_line_and_the_strip_comes_with_a_warning() -> None:
    scanning = start_here.line(FindingsProgress([], ["t"], [], 0))
    done = start_here.line(FindingsProgress([_finding("info")], [], [], 1))
    off = start_here.line(FindingsProgress([], [], [], 0, background=False))
    found = start_here.line(FindingsProgress([_finding("info"), _finding("warning")], ["t"], [], 1))
    assert [c.className for c in (scanning, done, off)] == ["start-here-status"] * 3
    assert start_here.SCANNING in _text(scanning) and start_here.NOTHING_FOUND in _text(done)
    assert "--no-findings-scan" in _text(off)
    assert found.className == "start-here-box" and "layer.out, step 3" in _text(found)
    # each line closes the same way (the one pattern-matching id the close callback listens to)
    for component in (scanning, done, off, found):
        assert component.children[-1].id == {"type": start_here.ID.CLOSE, "index": 0}

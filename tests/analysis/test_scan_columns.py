"""``comgra scan``'s list keeps its columns after a long node name (issue 33, item 12): the name is cut in its middle
with an ellipsis, and every line's summary starts in the same column."""
from __future__ import annotations

from types import SimpleNamespace

from rich.console import Console

from comgra.cli.scan import print_findings

LONG = "model.encoder.layers.11.self_attention.output_projection.weight"


def finding(node: str, step: int | None, severity: str = "warning") -> SimpleNamespace:
    return SimpleNamespace(trial="trial", node=node, training_step=step, severity=severity, detector="dead_units",
                           message=f"{node} has units that never activate.", statistic="mean")


def test_the_summaries_line_up_after_a_long_node_name():
    console = Console(record=True, width=200, highlight=False, markup=False, emoji=False, force_terminal=False)
    found = [finding("out", 3), finding(LONG, 1200), finding("hidden", None, "error")]
    print_findings(console, found, [], ["trial"], verbose=False, link=lambda f: "", path="GROUP")
    lines = [line for line in console.export_text().splitlines() if "never activate" in line]
    assert len(lines) == 3
    assert len({line.index("has units") for line in lines}) == 1, lines  # one column for every summary
    long_line = next(line for line in lines if "…" in line)
    assert "model.encoder" in long_line and "@ step 1200" in long_line  # both ends of the name are kept

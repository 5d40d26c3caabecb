"""A module called several times per step (a shared block, an RNN cell): nothing counted twice.

The model has known sleeps in its backward pass (a custom autograd Function that sleeps there), so
the expected backward times are known, and the wall time of each ``loss.backward()`` is measured by
the test itself: the backward times of modules that do not contain each other can never add up to
more than the backward pass they ran in.
"""
from __future__ import annotations

import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from comgra.analysis import profile as analysis  # noqa: E402
from sleep_in_backward import SleepInBackward, profiled_steps  # noqa: E402

CALLS = 3  # of the shared block per step
STEPS = 3
FORWARD_SLEEP = 0.010  # the shared block's forward, per call
BACKWARD_SLEEP = 0.030  # the shared block's backward, per call
NET_BACKWARD_SLEEP = 0.040  # the net's own backward (outside its children)
SLACK = 0.5  # seconds: a loaded machine may stall a thread, never make a sleep shorter


class Shared(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        time.sleep(FORWARD_SLEEP)
        return SleepInBackward.apply(torch.tanh(self.lin(x)), BACKWARD_SLEEP)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared = Shared()
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x: Any) -> Any:
        for _ in range(CALLS):
            x = self.shared(x)
        return SleepInBackward.apply(self.head(x), NET_BACKWARD_SLEEP)


@pytest.fixture(scope="module", params=["native", "python"])  # the backward marker: C++ or a Python hook
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], list[float]]:
    """The layers rows of STEPS profiled steps, and the wall time of each step's backward pass."""
    torch.manual_seed(0)
    rows, _, backward_walls = profiled_steps(Net(), tmp_path_factory.mktemp("repeated"), STEPS, marker=request.param)
    return rows, backward_walls


def _rows(rows: list[dict[str, Any]], module: str, step: int) -> list[dict[str, Any]]:
    return sorted((r for r in rows if r["module"] == module and r["training_step"] == step), key=lambda r: r["call"])


def test_each_call_is_one_row_with_its_own_times(run: Any) -> None:
    rows, _ = run
    for step in range(STEPS):
        calls = _rows(rows, "net.shared", step)
        assert [r["call"] for r in calls] == list(range(CALLS))
        for row in calls:
            assert FORWARD_SLEEP <= row["forward_time"] < FORWARD_SLEEP + SLACK
            assert BACKWARD_SLEEP <= row["backward_time"] < BACKWARD_SLEEP + SLACK


def test_backward_times_never_add_up_to_more_than_the_backward_pass(run: Any) -> None:
    rows, walls = run
    for step, wall in enumerate(walls):
        shared = sum(r["backward_time"] for r in _rows(rows, "net.shared", step))
        head = _rows(rows, "net.head", step)[0]["backward_time"]
        net = _rows(rows, "net", step)[0]["backward_time"]
        assert CALLS * BACKWARD_SLEEP <= shared  # each call's sleep is in its own time ...
        assert shared + head + NET_BACKWARD_SLEEP <= net <= wall  # ... once: the parent holds it, the pass holds the parent


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_the_flame_graph_nests_and_counts_nothing_twice(run: Any, phase: str) -> None:
    rows, walls = run
    nodes = {n.name: n for n in analysis.flame_graph(rows, phase)}
    assert set(nodes) == {"net", "net.shared", "net.shared.lin", "net.head"}
    for node in nodes.values():
        children = [c for c in nodes.values() if c.parent == node.name]
        assert node.value >= sum(c.value for c in children)
        assert node.self_value == pytest.approx(node.value - sum(c.value for c in children))
    net_rows = [r for r in rows if r["module"] == "net"]
    # The root's bar is what the root measured, not widened to hold children counted more than once.
    assert nodes["net"].value == pytest.approx(sum(r[f"{phase}_time"] for r in net_rows))
    shared = nodes["net.shared"]
    assert shared.calls == CALLS * STEPS
    sleep = FORWARD_SLEEP if phase == "forward" else BACKWARD_SLEEP
    assert CALLS * STEPS * sleep <= shared.value < CALLS * STEPS * sleep + SLACK
    if phase == "backward":
        assert nodes["net"].value <= sum(walls)
        # The net's own backward sleep is its self time, not hidden under children counted twice.
        assert STEPS * NET_BACKWARD_SLEEP <= nodes["net"].self_value < STEPS * NET_BACKWARD_SLEEP + SLACK


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_the_slowest_layers_table_counts_each_call(run: Any, phase: str) -> None:
    rows, walls = run
    summary = {s.module: s for s in analysis.layer_summary(rows, phase)}
    shared = summary["net.shared"]
    sleep = FORWARD_SLEEP if phase == "forward" else BACKWARD_SLEEP
    times = [r[f"{phase}_time"] for r in rows if r["module"] == "net.shared"]
    assert shared.calls == CALLS * STEPS == len(times)
    assert shared.total == pytest.approx(sum(times))
    assert sleep <= shared.min <= shared.mean <= shared.max < sleep + SLACK
    assert shared.mean == pytest.approx(shared.total / shared.calls)
    if phase == "backward":
        assert shared.total <= summary["net"].total <= sum(walls)


def test_the_chrome_trace_has_one_backward_slice_per_call_and_none_overlap(run: Any) -> None:
    rows, _ = run
    events = analysis.chrome_trace(rows, trial="trial")["traceEvents"]
    begins = {e["id"]: e for e in events if e["ph"] == "b" and e["name"] == "net.shared"}
    ends = {e["id"]: e for e in events if e["ph"] == "e" and e["name"] == "net.shared"}
    assert len(begins) == len(ends) == CALLS * STEPS
    spans = sorted((begins[i]["ts"], ends[i]["ts"]) for i in begins)
    for start, end in spans:
        assert BACKWARD_SLEEP * 1e6 <= end - start < (BACKWARD_SLEEP + SLACK) * 1e6
    for (_, end), (next_start, _) in zip(spans, spans[1:]):
        assert end <= next_start + 1.0  # microseconds; the slices of one module follow each other
    forward = [e for e in events if e["ph"] == "X" and e["name"] == "net.shared"]
    assert len(forward) == CALLS * STEPS
    assert all(FORWARD_SLEEP * 1e6 <= e["dur"] < (FORWARD_SLEEP + SLACK) * 1e6 for e in forward)

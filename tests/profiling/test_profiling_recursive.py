"""A module that calls itself: its inner calls are part of its outer call, and no second is counted twice.

Each level of the recursion sleeps a known time in its forward and, through a custom autograd
Function, in its backward. The test times each step's forward and backward pass itself: a module's
total time can never exceed the passes it ran in, however deep it calls itself.
"""
from __future__ import annotations

import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from comgra.analysis import profile as analysis  # noqa: E402
from sleep_in_backward import SleepInBackward, profiled_steps  # noqa: E402

DEPTH = 2  # inner calls below the outer one: DEPTH + 1 calls per step
STEPS = 2
FORWARD_SLEEP = 0.010  # per level
BACKWARD_SLEEP = 0.020  # per level
SLACK = 0.5  # seconds: a loaded machine may stall a thread, never make a sleep shorter


class Recursive(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: Any, depth: int = DEPTH) -> Any:
        time.sleep(FORWARD_SLEEP)
        if depth:
            x = self(x, depth - 1)
        return SleepInBackward.apply(torch.tanh(self.lin(x)), BACKWARD_SLEEP)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rec = Recursive()

    def forward(self, x: Any) -> Any:
        return self.rec(x)


@pytest.fixture(scope="module", params=["native", "python"])  # the backward marker: C++ or a Python hook
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], list[float], list[float]]:
    """The layers rows of STEPS profiled steps, and the wall time of each step's forward and backward pass."""
    torch.manual_seed(0)
    return profiled_steps(Net(), tmp_path_factory.mktemp("recursive"), STEPS, marker=request.param)


def _outer_calls(rows: list[dict[str, Any]], phase: str) -> list[float]:
    """The outer call of each step is its first (calls are numbered in the order they began)."""
    return [r[f"{phase}_time"] for r in rows if r["module"] == "net.rec" and r["call"] == 0]


def test_every_level_is_a_call_that_contains_the_levels_below(run: Any) -> None:
    rows, _, _ = run
    for step in range(STEPS):
        calls = sorted((r for r in rows if r["module"] == "net.rec" and r["training_step"] == step),
                       key=lambda r: r["call"])
        assert [r["call"] for r in calls] == list(range(DEPTH + 1))
        for level, row in enumerate(calls):  # call 0 is the outermost: DEPTH + 1 levels of sleep
            levels = DEPTH + 1 - level
            assert levels * FORWARD_SLEEP <= row["forward_time"] < levels * FORWARD_SLEEP + SLACK
            assert levels * BACKWARD_SLEEP <= row["backward_time"] < levels * BACKWARD_SLEEP + SLACK


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_the_slowest_layers_table_counts_inner_calls_inside_the_outer_one(run: Any, phase: str) -> None:
    rows, forward_walls, backward_walls = run
    walls = forward_walls if phase == "forward" else backward_walls
    summary = {s.module: s for s in analysis.layer_summary(rows, phase)}
    recursive = summary["net.rec"]
    assert recursive.total == pytest.approx(sum(_outer_calls(rows, phase)))
    assert recursive.total <= sum(walls)  # counted twice, the inner levels would not fit in the passes
    assert recursive.calls == STEPS  # executions from outside; the inner ones are part of them
    assert recursive.mean == pytest.approx(recursive.total / recursive.calls)


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_the_flame_graph_counts_inner_calls_inside_the_outer_one(run: Any, phase: str) -> None:
    rows, forward_walls, backward_walls = run
    walls = forward_walls if phase == "forward" else backward_walls
    nodes = {n.name: n for n in analysis.flame_graph(rows, phase)}
    assert nodes["net.rec"].value == pytest.approx(sum(_outer_calls(rows, phase)))
    assert nodes["net"].value <= sum(walls)
    assert nodes["net"].value >= nodes["net.rec"].value >= nodes["net.rec.lin"].value
    lin_rows = [r[f"{phase}_time"] for r in rows if r["module"] == "net.rec.lin"]
    assert len(lin_rows) == STEPS * (DEPTH + 1)  # a module inside the recursion, not itself nested: every call
    assert nodes["net.rec.lin"].value == pytest.approx(sum(lin_rows))

"""The C++ backward marker (profiling/native_marker): the same moments as the Python hook, for far less.

The recursive and repeated-call tests run with both markers (their fixtures are parametrized); here:
the marker alone against clocks read by the test, a hook left on an earlier step's graph, a module
without parameters (its end is noted by Python hooks and checked against the C++ starts at the step's
end), the tutorial taking the C++ path, and the fallbacks.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from sleep_in_backward import SleepInBackward, profiled_steps  # noqa: E402

from comgra.profiling import native_marker  # noqa: E402
from comgra.profiling.layer_calls import BACKWARD_START  # noqa: E402

needs_compiler = pytest.mark.skipif(native_marker._compiler() is None, reason="no C++ compiler to build the marker")


@pytest.fixture(scope="module")
def built() -> None:
    if not native_marker.ensure_built():
        pytest.fail("a C++ compiler is here, but the native marker did not build or failed its self-test")


def _record() -> list[Any]:
    return [None] * 8


@needs_compiler
def test_a_mark_is_the_moment_the_gradient_reaches_the_node(built: None) -> None:
    marker = native_marker.marker(BACKWARD_START)
    leaf = torch.ones(4, requires_grad=True)
    first, shared, unreached = _record(), _record(), _record()
    marker.open()
    output = leaf * 2.0
    assert marker.mark(output, first) and marker.mark(output, shared)  # two calls returning one tensor
    assert marker.mark(leaf * 3.0, unreached)  # never differentiated
    assert not marker.mark(leaf, _record())  # a leaf has no autograd node
    loss = SleepInBackward.apply(output, 0.02).sum()
    before = time.perf_counter()
    loss.backward()
    after = time.perf_counter()
    finishes, error = marker.close()
    assert error == ""
    assert first[BACKWARD_START] == shared[BACKWARD_START]
    assert unreached[BACKWARD_START] is None
    # The gradient reaches ``output``'s node after the 0.02-s sleep of the node above it.
    assert before + 0.02 <= first[BACKWARD_START] <= finishes[0] <= after
    assert len(finishes) == 1


@needs_compiler
def test_a_mark_left_on_an_earlier_steps_graph_writes_nothing_into_this_step(built: None) -> None:
    marker = native_marker.marker(BACKWARD_START)
    leaf = torch.ones(4, requires_grad=True)
    old, new = _record(), _record()
    marker.open()
    kept = leaf * 2.0
    marker.mark(kept, old)
    marker.close()  # the step ended before its backward
    marker.open()
    marker.mark(leaf * 5.0, new)
    kept.sum().backward()  # the earlier step's graph, differentiated during this step
    finishes, error = marker.close()
    assert (old[BACKWARD_START], new[BACKWARD_START], finishes, error) == (None, None, [], "")


@needs_compiler
def test_a_slot_keeps_its_first_moment_over_two_backward_passes(built: None) -> None:
    marker = native_marker.marker(BACKWARD_START)
    leaf = torch.ones(4, requires_grad=True)
    record = _record()
    marker.open()
    output = leaf * 2.0
    marker.mark(output, record)
    output.sum().backward(retain_graph=True)
    middle = time.perf_counter()
    output.sum().backward()
    finishes, _ = marker.close()
    assert record[BACKWARD_START] < middle < finishes[1]
    assert len(finishes) == 2


class WithoutParameters(torch.nn.Module):
    """A module without parameters: its backward slice ends when its input's gradient is complete."""

    def forward(self, x: Any) -> Any:
        return SleepInBackward.apply(torch.tanh(x), 0.03)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.act = WithoutParameters()
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x: Any) -> Any:
        return SleepInBackward.apply(self.head(self.act(self.lin(x))), 0.02)


@needs_compiler
def test_both_markers_give_the_same_calls_and_known_backward_times(built: None, tmp_path: Path) -> None:
    torch.manual_seed(0)
    native, _, native_walls = profiled_steps(Net(), tmp_path / "native", steps=2, marker="native")
    python, _, _ = profiled_steps(Net(), tmp_path / "python", steps=2, marker="python")
    key = ("training_step", "module", "call")
    assert sorted(tuple(r[k] for k in key) for r in native) == sorted(tuple(r[k] for k in key) for r in python)
    for rows in (native, python):
        times = {(r["training_step"], r["module"]): r["backward_time"] for r in rows}
        for step in (0, 1):
            assert 0.03 <= times[step, "net.act"] < 0.03 + 0.5  # its own sleep, ended at its input's gradient
            assert times[step, "net.act"] + 0.02 <= times[step, "net"]  # the net's own sleep is outside act
            assert times[step, "net"] <= native_walls[step] if rows is native else True


@needs_compiler
def test_the_tutorial_takes_the_native_path(built: None, make_recorder: Any) -> None:
    import comgra
    from comgra.examples import tutorial

    torch.manual_seed(0)
    model = tutorial.SequenceSumNetwork(16, activate_output=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    recorder = make_recorder(steps={0}, resource_seconds=None)
    recorder.track_module("main_model", model, profile=True)
    comgra.my_recorder = recorder
    generator = torch.Generator().manual_seed(1)
    for step in range(3):
        tutorial._training_step(model, optimizer, step, tutorial._make_batch(4, generator, torch.device("cpu")))
    profiler = recorder.instruments.profiler
    assert profiler._marks.native is not None
    rows = [row for name in profiler.layer_names for row in profiler.history(name)]
    unreached = {(r["module"], r["call"]) for r in rows if r["training_step"] == 2 and r["backward_time"] is None}
    # The 4th (last) iteration's memory feeds nothing: no gradient ever reaches subnet_mem's 4th call.
    assert unreached == {(f"main_model.subnet_mem{child}", 3) for child in ("", ".layer_in", ".layer_out")}
    assert len([r for r in rows if r["training_step"] == 2]) == 4 * 6 + 3


def test_switched_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMGRA_NATIVE_MARKER", "0")
    for name, value in {"value": None, "building": False, "failed": False}.items():
        monkeypatch.setattr(native_marker._BUILD, name, value)
    assert native_marker.marker(BACKWARD_START) is None
    assert native_marker._BUILD.failed


def test_a_library_that_does_not_load_is_no_marker(tmp_path: Path) -> None:
    broken = tmp_path / "native_marker-broken.so"
    broken.write_bytes(b"not a shared library")
    assert native_marker._load(broken) is None

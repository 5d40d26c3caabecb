"""The C++ forward handler (``native_marker.lean_handler``): a plain profiled step's module calls measured
without Python, giving the rows the Python handler gives, and every other call handed to the Python handler.

Each test runs the same model with the C++ handler (``lean``) and with the Python handler alone, and counts
the calls that reach the Python handler, so that a C++ path that silently fell back would fail.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from comgra.profiling import forward_wrappers, native_marker  # noqa: E402
from comgra.profiling.layer_calls import CallMarks  # noqa: E402
from comgra.profiling.profiler import ProfileOptions, Profiler  # noqa: E402

pytestmark = pytest.mark.skipif(native_marker._compiler() is None, reason="no C++ compiler to build the marker")


class Pair(torch.nn.Module):
    """Returns a tuple: its bytes are those of both tensors, its marker on the first."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: Any, *, scale: float = 1.0) -> Any:
        y = self.lin(x)
        return y * scale, y * 2.0


class Failing(torch.nn.Module):
    """Raises while ``fail`` is set, after its own Linear ran."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.fail = False

    def forward(self, x: Any) -> Any:
        y = self.lin(x)
        if self.fail:
            raise ValueError("the user's forward failed")
        return y


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.pair = Pair()
        self.failing = Failing()
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x: Any) -> Any:
        a, b = self.pair(self.lin(x), scale=0.5)  # a keyword argument passes through the C++ handler
        try:
            a = self.failing(a)
        except ValueError:
            pass
        return self.head(a + b)


@pytest.fixture(scope="module")
def built() -> None:
    if not native_marker.ensure_built():
        pytest.fail("a C++ compiler is here, but the native marker did not build or failed its self-test")


@pytest.fixture
def python_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the layers whose calls reached a Python handler (the C++ handler's fallback)."""
    calls: list[str] = []
    make = CallMarks.forward_handler

    def counting(self: CallMarks, layer: Any) -> Any:
        handler = make(self, layer)

        def counted(*args: Any) -> Any:
            calls.append(layer.name)
            return handler(*args)
        return counted

    monkeypatch.setattr(CallMarks, "forward_handler", counting)
    yield calls


def _steps(monkeypatch: pytest.MonkeyPatch, *, lean: bool, details: tuple[bool, ...] = (False, False, False),
           failing_step: int | None = 1) -> tuple[list[dict[str, Any]], Profiler, Net]:
    monkeypatch.setattr(CallMarks, "lean_default", lean)
    torch.manual_seed(0)
    net = Net()
    profiler = Profiler(ProfileOptions(flops_every=0))
    profiler.add("net", net)
    for step, detail in enumerate(details):
        net.failing.fail = step == failing_step
        profiler.start_step(step, detail=detail)
        net(torch.ones(2, 4, requires_grad=True)).pow(2).mean().backward()
        profiler.finish_step()
    assert profiler.error is None
    table = profiler.take(force=True)
    assert table is not None
    return table.to_pylist(), profiler, net


def _shape(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["training_step"], r["module"], r["call"], r["output_bytes"], r["backward_time"] is not None)
            for r in rows]


def test_plain_calls_are_measured_in_cpp_with_the_python_handlers_rows(built: None, python_calls: list[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    lean_rows, profiler, net = _steps(monkeypatch, lean=True)
    handlers = {type(forward_wrappers._PATCHES[type(module)].handlers[id(module)]).__name__
                for module in net.modules()}
    assert handlers == {"builtin_function_or_method"}
    assert python_calls == []  # not one call of the plain steps went to Python
    profiler.close()
    python_rows, profiler, _ = _steps(monkeypatch, lean=False)
    assert python_calls  # the control: the Python handler measured these
    profiler.close()
    assert _shape(lean_rows) == _shape(python_rows)
    by_call = {(r["training_step"], r["module"], r["call"]): r for r in lean_rows}
    assert by_call[0, "net.pair", 0]["output_bytes"] == 2 * (2 * 4 * 4)  # both tensors of the tuple
    assert by_call[1, "net.failing", 0]["backward_time"] is None  # it raised: its output never existed
    assert by_call[0, "net.failing", 0]["backward_time"] is not None
    for (step, module, call), row in by_call.items():
        assert row["forward_time"] > 0
        if module.count(".") == 2:  # a Linear inside Pair or Failing: within its parent's forward
            parent = by_call[step, module.rsplit(".", 1)[0], call]
            assert parent["forward_start"] <= row["forward_start"]
            assert row["forward_start"] + row["forward_time"] <= parent["forward_start"] + parent["forward_time"]


def test_a_forward_that_raises_still_raises_and_profiling_goes_on(built: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CallMarks, "lean_default", True)
    failing = Failing()
    profiler = Profiler(ProfileOptions(flops_every=0))
    profiler.add("failing", failing)
    failing.fail = True
    profiler.start_step(0, detail=False)
    with pytest.raises(ValueError, match="the user's forward failed"):
        failing(torch.ones(2, 4))
    profiler.finish_step()
    failing.fail = False
    profiler.start_step(1, detail=False)
    failing(torch.ones(2, 4)).sum().backward()
    profiler.finish_step()
    rows = profiler.take(force=True).to_pylist()
    profiler.close()
    assert profiler.error is None
    assert [(r["training_step"], r["module"]) for r in rows] == [
        (0, "failing"), (0, "failing.lin"), (1, "failing"), (1, "failing.lin")]
    assert all(r["forward_time"] > 0 for r in rows)


def test_a_step_that_measures_more_goes_to_the_python_handler(built: None, python_calls: list[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    rows, profiler, _ = _steps(monkeypatch, lean=True, details=(False, True, False), failing_step=None)
    profiler.close()
    assert set(python_calls) == {"net", "net.lin", "net.pair", "net.pair.lin", "net.failing", "net.failing.lin",
                                 "net.head"}
    assert len(python_calls) == 7  # the recorded step's calls, each once
    statistics = {r["training_step"]: r["act_mean"] is not None for r in rows if r["module"] == "net.head"}
    assert statistics == {0: False, 1: True, 2: False}


def test_a_torch_profiler_sees_the_modules_with_the_cpp_handler(built: None, python_calls: list[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CallMarks, "lean_default", True)
    net = Net()
    profiler = Profiler(ProfileOptions(flops_every=0))
    profiler.add("net", net)
    profiler.start_step(0, detail=False)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as trace:
        net(torch.ones(2, 4)).sum().backward()
    profiler.finish_step()
    rows = profiler.take(force=True).to_pylist()
    profiler.close()
    names = {event.name for event in trace.events()}
    assert {"net", "net.pair", "net.head"} <= names
    assert len(python_calls) == 7 and len(rows) == 7


@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")
def test_traces_and_compiles_record_nothing_with_the_cpp_handler(built: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._dynamo.utils import counters

    monkeypatch.setattr(CallMarks, "lean_default", True)
    lin = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    profiler = Profiler(ProfileOptions(flops_every=0))
    profiler.add("seq", lin)
    x = torch.randn(2, 4)
    profiler.start_step(0, detail=False)  # the C++ handlers are put in place at the first step
    assert type(forward_wrappers._PATCHES[torch.nn.Linear].handlers[id(lin[0])]).__name__ == "builtin_function_or_method"
    traced = torch.jit.trace(lin, x, check_trace=False)
    graph = torch.fx.symbolic_trace(lin)
    assert not profiler._records  # the traces ran the forwards; none of those calls is an execution
    profiler.finish_step()
    assert torch.allclose(traced(x), lin(x)) and torch.allclose(graph(x), lin(x))
    compiled = torch.compile(lin, backend="eager")
    counters.clear()
    for step in range(1, 4):
        profiler.start_step(step, detail=False)
        compiled(x)
        assert not profiler._records
        profiler.finish_step()
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    profiler.close()
    assert not forward_wrappers.attached(torch.nn.Linear)  # the classes are restored with C++ handlers too


def test_the_cpp_handlers_take_over_once_the_marker_is_built(built: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first run builds the marker on a thread while training goes on: the steps before it is ready use the Python
    handlers, the steps after it the C++ ones, and every step has its rows."""
    monkeypatch.setattr(CallMarks, "lean_default", True)
    ready = native_marker.marker
    monkeypatch.setattr(native_marker, "marker", lambda start_index: None)  # still building
    net = Net()
    profiler = Profiler(ProfileOptions(flops_every=0))
    profiler.add("net", net)

    def handler_kinds() -> set[str]:
        return {type(forward_wrappers._PATCHES[type(m)].handlers[id(m)]).__name__ for m in net.modules()}

    for step in range(3):
        if step == 1:
            monkeypatch.setattr(native_marker, "marker", ready)  # the build is done
        profiler.start_step(step, detail=False)
        assert handler_kinds() == ({"function"} if step == 0 else {"builtin_function_or_method"})
        net(torch.ones(2, 4)).sum().backward()
        profiler.finish_step()
    rows = profiler.take(force=True).to_pylist()
    profiler.close()
    assert profiler.error is None
    assert [len([r for r in rows if r["training_step"] == step]) for step in range(3)] == [7, 7, 7]
    assert all(r["backward_time"] is not None for r in rows if r["module"] == "net.head")

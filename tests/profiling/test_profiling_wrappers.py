"""The profiler's class-level forward wrappers: nothing on the instances, each call counted once, classes restored.

The classes are defined at module level so that pickle and torch.save can find them.
"""
from __future__ import annotations

import copy
import io
import pickle
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from comgra.profiling import forward_wrappers  # noqa: E402
from comgra.profiling.profiler import ProfileOptions, Profiler  # noqa: E402


class Base(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        return torch.relu(self.lin(x))


class Doubling(Base):
    """Its forward calls the base class's: one call of a Doubling must be one row, not two."""

    def forward(self, x: Any) -> Any:
        return super().forward(x) * 2


class Inheriting(Base):
    """No forward of its own: the wrapper on this class calls Base's."""


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.base, self.doubling, self.inheriting = Base(), Doubling(), Inheriting()
        self.spare = Base()  # called, never tracked on its own (see the test of two instances)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x: Any) -> Any:
        return self.head(self.inheriting(self.doubling(self.base(x))))


CLASSES = (Net, Base, Doubling, Inheriting, torch.nn.Linear)


def _net() -> Net:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Net()


def _profiled_step(profiler: Profiler, *modules: torch.nn.Module, step: int = 0) -> list[tuple[str, int]]:
    """One step calling each module; the (module, call) rows of that step."""
    profiler.start_step(step, detail=False)
    for module in modules:
        module(torch.ones(2, 4, requires_grad=True)).sum().backward()
    profiler.finish_step()
    table = profiler.take(force=True)
    return [] if table is None else list(zip(table.column("module").to_pylist(), table.column("call").to_pylist()))


@pytest.fixture
def profiler() -> Any:
    profiler = Profiler(ProfileOptions(flops_every=0))
    yield profiler
    profiler.close()


def test_each_call_is_one_row_once_whatever_the_class_hierarchy(profiler: Profiler) -> None:
    net = _net()
    profiler.add("net", net)
    rows = _profiled_step(profiler, net)
    assert sorted(rows) == sorted([("net", 0), ("net.base", 0), ("net.base.lin", 0), ("net.doubling", 0),
                                   ("net.doubling.lin", 0), ("net.inheriting", 0), ("net.inheriting.lin", 0),
                                   ("net.head", 0)])
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())
    assert not profiler._handles and not any(p._post_accumulate_grad_hooks for p in net.parameters())


def test_an_untracked_instance_of_a_tracked_class_is_not_counted(profiler: Profiler) -> None:
    net, other = _net(), Base()
    profiler.add("base", net.base)
    rows = _profiled_step(profiler, net.base, other, net.spare, net.base)
    assert rows == [("base", 0), ("base.lin", 0), ("base", 1), ("base.lin", 1)]


def test_the_classes_are_restored_exactly_and_share_their_wrapper(make_recorder: Any) -> None:
    before = {cls: dict(vars(cls)) for cls in CLASSES}
    first, second = _net(), _net()
    recorder_a = make_recorder(trial_id="a", steps=set(), resource_seconds=None)
    recorder_b = make_recorder(trial_id="b", steps=set(), resource_seconds=None)
    recorder_a.track_module("net", first, profile=True)
    recorder_b.track_module("net", second, profile=True)
    assert vars(Inheriting)["forward"] is not vars(Base)["forward"]
    assert all(forward_wrappers.attached(cls) for cls in CLASSES)
    recorder_a.finalize()  # the other recorder still uses the classes
    assert all(forward_wrappers.attached(cls) for cls in CLASSES)
    assert vars(Base)["forward"] is not before[Base]["forward"]
    recorder_b.finalize()
    for cls in CLASSES:
        assert dict(vars(cls)) == before[cls], cls
        assert vars(cls).get("forward") is before[cls].get("forward")
    assert "forward" not in vars(Inheriting) and not forward_wrappers.attached(Base)


def test_a_profiled_model_deepcopies_pickles_and_saves(profiler: Profiler) -> None:
    net = _net()
    untouched = pickle.dumps(net)
    profiler.add("net", net)
    _profiled_step(profiler, net)
    assert pickle.dumps(net) == untouched  # nothing of the profiler's is on the instances
    twin = copy.deepcopy(net)
    loaded = pickle.loads(pickle.dumps(net))
    buffer = io.BytesIO()
    torch.save(net, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    state = io.BytesIO()
    torch.save(net.state_dict(), state)
    state.seek(0)
    assert set(torch.load(state)) == set(net.state_dict())
    x = torch.randn(2, 4)
    for other in (twin, loaded, saved):
        assert torch.equal(other(x), net(x))
    # The copies are plain modules: a step that calls them and the original counts the original once.
    rows = _profiled_step(profiler, twin, net, loaded, saved, step=1)
    assert sorted(name for name, _ in rows).count("net.doubling") == 1 and max(call for _, call in rows) == 0


def test_an_instance_with_its_own_forward_attribute_falls_back_to_hooks(profiler: Profiler) -> None:
    net = _net()
    net.base.forward = lambda x: torch.relu(net.base.lin(x))  # e.g. accelerate's hooks do this
    profiler.add("net", net)
    assert net.base._forward_hooks and not net.doubling._forward_hooks
    assert sorted(_profiled_step(profiler, net))[:3] == [("net", 0), ("net.base", 0), ("net.base.lin", 0)]
    profiler.close()
    assert not net.base._forward_hooks and "forward" in vars(net.base)


@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")
def test_tracing_a_profiled_model_records_nothing_and_works(profiler: Profiler) -> None:
    net = _net()
    profiler.add("net", net)
    profiler.start_step(0, detail=False)
    x = torch.randn(2, 4)
    traced = torch.jit.trace(net, x, check_trace=False)  # its check would run the model eagerly
    graph = torch.fx.symbolic_trace(net)
    assert not profiler._records  # the traces ran the forwards; none of those calls is a measured execution
    profiler.finish_step()
    assert torch.allclose(traced(x), net(x)) and torch.allclose(graph(x), net(x))
    assert "comgra" not in graph.code


def test_the_same_layers_and_nesting_as_with_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tutorial model: the wrappers report exactly the executions the hooks reported, nested alike."""
    from comgra.examples import tutorial

    class Recorder:  # the tutorial registers tensors with comgra.my_recorder; nothing to record here
        def register_tensor(self, *args: Any, **kwargs: Any) -> None:
            pass

    import comgra

    monkeypatch.setattr(comgra, "my_recorder", Recorder(), raising=False)

    def executions(use_wrappers: bool) -> list[tuple[str, int, float, float]]:
        torch.manual_seed(0)
        model = tutorial.SequenceSumNetwork(16, activate_output=False)
        with monkeypatch.context() as patch:
            if not use_wrappers:
                patch.setattr(forward_wrappers, "attach", lambda module, handler: False)
            profiler = Profiler(ProfileOptions(flops_every=0))
            profiler.add("main_model", model)
        profiler.start_step(0, detail=False)
        x = torch.randn(4, tutorial.NUM_SEQUENCES)
        memory = torch.zeros(4, tutorial.MEMORY_SIZE)
        for _ in range(3):
            hidden, memory = model.step(x, memory)
        model.readout(hidden).sum().backward()
        profiler.finish_step()
        table = profiler.take(force=True)
        profiler.close()
        columns = [table.column(name).to_pylist() for name in ("module", "call", "forward_start", "forward_time")]
        return list(zip(*columns))

    with_wrappers, with_hooks = executions(True), executions(False)
    assert [(m, c) for m, c, _, _ in with_wrappers] == [(m, c) for m, c, _, _ in with_hooks]
    assert len(with_wrappers) == 3 * 2 * 3 + 3  # subnet_pre and subnet_mem per iteration, subnet_out once
    spans = {(m, c): (start, start + time) for m, c, start, time in with_wrappers}
    for (module, call), (start, end) in spans.items():
        if module.count(".") == 2:  # a Linear inside a SubNet: inside its parent's call of the same index
            parent = spans[(module.rsplit(".", 1)[0], call)]
            assert parent[0] <= start <= end <= parent[1]


def test_a_compiled_profiled_model_compiles_once_and_is_not_measured(profiler: Profiler) -> None:
    """Under torch.compile there are no module calls to time; the wrappers must not break the graph or force
    a recompilation on each step (they read nothing that changes per step before knowing they are traced)."""
    from torch._dynamo.utils import counters

    net = _net()
    profiler.add("net", net)
    compiled = torch.compile(net, backend="eager")
    counters.clear()
    x = torch.ones(2, 4, requires_grad=True)  # as in _profiled_step: requires_grad is part of dynamo's guards
    compiled(x)  # outside a profiled step first, then within steps: a guard on the profiler's state would recompile
    for step in range(3):
        assert _profiled_step(profiler, compiled, step=step) == []
        compiled(x)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert torch.allclose(compiled(x), net(x))

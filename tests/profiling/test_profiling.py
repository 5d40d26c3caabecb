"""Per-layer profiling: times against known sleeps, nesting, FLOPs against FlopCounterMode, history, hooks."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parents[1] / "api"))
from profiled_recording import SLEEP_A, SLEEP_B, SLEEP_B1, TRIAL, nested_model, record  # noqa: E402

from comgra.analysis import profile as analysis  # noqa: E402
from comgra.store.reader import GroupReader  # noqa: E402

SLACK = 0.5  # seconds: a loaded CI machine may stall a thread, never make a sleep shorter


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    group = record(tmp_path_factory.mktemp("profile") / "store", steps=4, resource_seconds=None)
    reader = GroupReader(group)
    try:
        return reader.trial(TRIAL).layers().to_pylist()
    finally:
        reader.close()


def _by(rows: list[dict[str, Any]], module: str, step: int) -> dict[str, Any]:
    return next(r for r in rows if r["module"] == module and r["training_step"] == step)


def test_every_submodule_is_profiled_under_its_dotted_name(rows: list[dict[str, Any]]) -> None:
    assert sorted({r["module"] for r in rows}) == [
        "net", "net.b1", "net.b1.a", "net.b1.a.lin", "net.b1.b", "net.b1.b.lin", "net.head"]
    assert sorted({r["training_step"] for r in rows}) == [0, 1, 2, 3]


@pytest.mark.parametrize(("module", "sleep"), [("net.b1.a", SLEEP_A), ("net.b1.b", SLEEP_B),
                                               ("net.b1", SLEEP_A + SLEEP_B + SLEEP_B1)])
def test_forward_times_match_the_known_sleeps(rows: list[dict[str, Any]], module: str, sleep: float) -> None:
    for step in range(4):
        assert sleep <= _by(rows, module, step)["forward_time"] < sleep + SLACK


def test_a_child_runs_inside_its_parent(rows: list[dict[str, Any]]) -> None:
    for step in range(4):
        for child, parent in (("net.b1.a", "net.b1"), ("net.b1.b", "net.b1"), ("net.b1", "net"), ("net.head", "net")):
            c, p = _by(rows, child, step), _by(rows, parent, step)
            assert p["forward_start"] <= c["forward_start"]
            assert c["forward_start"] + c["forward_time"] <= p["forward_start"] + p["forward_time"] + 1e-9


def test_the_flame_graph_nests_and_counts_nothing_twice(rows: list[dict[str, Any]]) -> None:
    nodes = {n.name: n for n in analysis.flame_graph(rows)}
    for node in nodes.values():
        children = [c for c in nodes.values() if c.parent == node.name]
        assert node.value >= sum(c.value for c in children) - 1e-12
        assert node.self_value == pytest.approx(node.value - sum(c.value for c in children))
    # The self times add up to the root's measured time: every second is in exactly one bar.
    assert sum(n.self_value for n in nodes.values()) == pytest.approx(nodes["net"].value)
    assert nodes["net"].value == pytest.approx(sum(_by(rows, "net", s)["forward_time"] for s in range(4)))
    # b1 sleeps SLEEP_B1 itself on each of 4 steps: that is its self time, not a's or b's.
    assert 4 * SLEEP_B1 <= nodes["net.b1"].self_value < 4 * SLEEP_B1 + SLACK
    assert nodes["net.b1.a"].parent == "net.b1" and nodes["net.b1.a"].label == "a"


def test_the_summary_lists_the_slowest_layers_first(rows: list[dict[str, Any]]) -> None:
    summary = analysis.layer_summary(rows)
    assert [s.module for s in summary][:2] == ["net", "net.b1"]  # they contain every sleep
    assert [s.total for s in summary] == sorted((s.total for s in summary), reverse=True)
    b = next(s for s in summary if s.module == "net.b1.b")
    times = [_by(rows, "net.b1.b", step)["forward_time"] for step in range(4)]
    assert (b.calls, b.total, b.min, b.max) == (4, pytest.approx(sum(times)), min(times), max(times))
    assert b.mean == pytest.approx(sum(times) / 4)


def test_the_chrome_trace_holds_every_execution(rows: list[dict[str, Any]]) -> None:
    trace = analysis.chrome_trace(rows, trial=TRIAL)
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(rows)
    a = next(e for e in complete if e["name"] == "net.b1.a" and e["args"]["training_step"] == 0)
    assert a["dur"] == pytest.approx(_by(rows, "net.b1.a", 0)["forward_time"] * 1e6)
    begins = [e for e in trace["traceEvents"] if e["ph"] == "b"]
    ends = {e["id"] for e in trace["traceEvents"] if e["ph"] == "e"}
    assert begins and {e["id"] for e in begins} == ends


def test_backward_times_are_measured(rows: list[dict[str, Any]]) -> None:
    for module in ("net", "net.b1", "net.b1.a.lin", "net.head"):
        row = _by(rows, module, 1)
        assert row["backward_time"] is not None and 0 <= row["backward_time"] < SLACK
    net, head, b1 = _by(rows, "net", 1), _by(rows, "net.head", 1), _by(rows, "net.b1", 1)
    assert head["backward_start"] <= b1["backward_start"]  # the gradient flows from the head back into b1
    # Both may end at the same moment (b1 is the last module the gradient reaches); start + time is a float64
    # near 1.8e9 s, whose resolution is about 0.24 us, so equal ends can differ by rounding.
    assert b1["backward_start"] + b1["backward_time"] <= net["backward_start"] + net["backward_time"] + 1e-6


def test_flops_match_flop_counter_mode(rows: list[dict[str, Any]]) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    net = nested_model()
    with FlopCounterMode(display=False) as counter:
        net(torch.zeros(3, 4))
    expected = {name.replace(type(net).__name__, "net", 1): sum(ops.values())
                for name, ops in counter.get_flop_counts().items() if name != "Global"}
    for module in ("net", "net.b1", "net.b1.a.lin", "net.head"):
        assert _by(rows, module, 0)["forward_flops"] == expected[module] > 0
    assert _by(rows, "net.b1", 1)["forward_flops"] is None  # by default FLOPs are counted on the first step only


def test_statistics_and_gradient_norms_on_recorded_steps(tmp_path: Path) -> None:
    """Checked against the same model run by hand: output statistics and parameter gradient norms."""
    group = record(tmp_path / "store", steps=1, resource_seconds=None)
    rows = GroupReader(group).trial(TRIAL).layers().to_pylist()
    net = nested_model()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    out = net.b1.a(x)
    net(x).pow(2).mean().backward()
    a = _by(rows, "net.b1.a", 0)
    assert a["act_mean"] == pytest.approx(out.mean().item(), rel=1e-5)
    assert a["act_std"] == pytest.approx(out.std().item(), rel=1e-5)
    assert a["act_abs_max"] == pytest.approx(out.abs().max().item(), rel=1e-5)
    expected = torch.sqrt(sum(p.grad.pow(2).sum() for p in net.b1.parameters())).item()
    assert _by(rows, "net.b1", 0)["grad_norm"] == pytest.approx(expected, rel=1e-5)
    assert a["output_bytes"] == out.numel() * out.element_size()
    assert a["cuda_allocated_delta"] is None and a["clock"] == "perf_counter"


def test_the_history_is_bounded(tmp_path: Path, make_recorder: Any) -> None:
    net = nested_model()
    recorder = make_recorder(steps=set(), profile_history=3, resource_seconds=None)
    recorder.track_module("net", net, profile=True)
    for step in range(5):
        recorder.start_batch(step, 3)
        recorder.start_iteration()
        net(torch.zeros(3, 4)).sum().backward()
        recorder.finish_iteration()
        recorder.finish_batch()
    history = recorder.instruments.profiler.history("net.b1.a")
    assert [row["training_step"] for row in history] == [2, 3, 4]


def test_profiling_leaves_no_hooks_and_changes_no_result(make_recorder: Any) -> None:
    def train(profile: bool) -> list[float]:
        net = nested_model()
        recorder = make_recorder(trial_id=f"p{profile}", steps={0}, resource_seconds=None)
        recorder.track_module("net", net, profile=profile)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        losses = []
        for step in range(3):
            recorder.start_batch(step, 3)
            recorder.start_iteration()
            loss = net(torch.ones(3, 4) * step).pow(2).mean()
            recorder.register_tensor("loss", loss, is_loss=True)
            recorder.finish_iteration()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            recorder.finish_batch()
            losses.append(loss.item())
        recorder.finalize()
        modules = list(net.modules())
        assert not any(m._forward_hooks or m._forward_pre_hooks for m in modules)
        assert not any(p._post_accumulate_grad_hooks for p in net.parameters())
        return losses

    assert train(True) == train(False)


def test_an_output_changed_in_place_still_trains(make_recorder: Any) -> None:
    """A residual ``x += ...`` on a profiled module's output: register_full_backward_hook would break it."""

    class Residual(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            y = self.inner(x)
            y += x
            return y

    net = Residual()
    recorder = make_recorder(steps={0}, resource_seconds=None)
    recorder.track_module("res", net, profile=True)
    recorder.start_batch(0, 2)
    recorder.start_iteration()
    net(torch.ones(2, 4, requires_grad=True)).sum().backward()
    recorder.finish_iteration()
    recorder.finish_batch()
    assert [row["module"] for row in recorder.instruments.profiler.history("res.inner")] == ["res.inner"]


def test_modules_appear_in_a_users_torch_profiler_trace(make_recorder: Any) -> None:
    net = nested_model()
    recorder = make_recorder(steps=set(), resource_seconds=None)
    recorder.track_module("net", net, profile=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        recorder.start_batch(0, 3)
        recorder.start_iteration()
        net(torch.zeros(3, 4))
        recorder.finish_iteration()
        recorder.finish_batch()
    names = {event.name for event in profiler.events()}
    assert {"net", "net.b1", "net.b1.a", "net.head"} <= names


def test_bad_profiling_options_are_config_errors(make_recorder: Any) -> None:
    from comgra.errors import ConfigError

    with pytest.raises(ConfigError, match="history"):
        make_recorder(profile_history=0)
    with pytest.raises(ConfigError, match="flops_every"):
        make_recorder(profile_flops_every=-1)


def test_every_nth_step_and_every_recorded_step_are_profiled(make_recorder: Any) -> None:
    net = nested_model()
    recorder = make_recorder(steps={3}, profile_every=2, resource_seconds=None)
    recorder.track_module("net", net, profile=True)
    for step in range(6):
        recorder.start_batch(step, 3)
        recorder.start_iteration()
        loss = net(torch.zeros(3, 4)).sum()
        recorder.register_tensor("loss", loss, is_loss=True)
        recorder.finish_iteration()
        loss.backward()
        recorder.finish_batch()
    assert [row["training_step"] for row in recorder.instruments.profiler.history("net.head")] == [0, 2, 3, 4]


def test_comgra_toml_sets_the_profiling_defaults(tmp_path: Path, make_recorder: Any) -> None:
    config = tmp_path / "comgra.toml"
    config.write_text("[history]\nlayer_executions = 2\n[profiling]\nenabled = true\nflops_every_steps = 1\n")
    net = nested_model()
    recorder = make_recorder(steps=set(), resource_seconds=None, config=config)
    recorder.track_module("net", net)  # profile=None: [profiling] enabled
    for step in range(3):
        recorder.start_batch(step, 3)
        recorder.start_iteration()
        net(torch.zeros(3, 4))
        recorder.finish_iteration()
        recorder.finish_batch()
    history = recorder.instruments.profiler.history("net.head")
    assert [row["training_step"] for row in history] == [1, 2]
    assert all(row["forward_flops"] == 24 for row in history)  # counted on every step (flops_every_steps = 1)


def test_a_plain_step_waits_for_its_flush_without_per_call_objects_the_collector_tracks() -> None:
    """The marks of steps not flushed yet are tuples of numbers (untracked by the garbage collector), not a list
    per module call: such lists would reach the collector's oldest generation and trigger full collections."""
    import gc

    from comgra.profiling.layer_calls import LAYER
    from comgra.profiling.profiler import ProfileOptions, Profiler

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    profiler = Profiler(ProfileOptions(flops_every=0))
    try:
        profiler.add("net", model)
        for step in range(3):
            profiler.start_step(step, detail=False)
            model(torch.randn(2, 4)).sum().backward()
            profiler.finish_step()
        gc.collect()
        pending = list(profiler._pending)
        assert len(pending) == 3 and all(capture.calls == 4 for capture in pending)
        for capture in pending:
            assert capture.records is None
            tracked = [field for field, column in enumerate(capture.columns) if gc.is_tracked(column)]
            assert tracked == [LAYER]  # the layers themselves; every other column holds numbers or None
        assert len(profiler.history("net.0")) == 3
    finally:
        profiler.close()

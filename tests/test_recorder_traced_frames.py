"""comgra's Python never runs inside a frame TorchDynamo traces.

A recorded step runs compiled models eagerly (comgra.capture.compiled; tests/compile/ has the real compiled
runs), so a trace on such a step is the exception (a model compiled in the middle of it): then an entry point
sees ``torch.compiler.is_compiling()`` and calls itself through ``torch.compiler.disable``, so that Dynamo ends
its graph there and comgra runs eagerly on real tensors. On a step that takes no tensors the calls made in a
compiled forward trace to nothing. Here the trace is simulated: every call of a recorded step goes through the
way out, with its arguments intact, and records what eager calls record; on an unrecorded step none does.
"""
from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import comgra.recorder as recorder_module  # noqa: E402


@pytest.fixture
def simulated_trace(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``_is_compiling()`` is True except inside the way out; returns the names of the methods that took it."""
    taken: list[str] = []
    state = {"tracing": True}

    def untraced(method: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            taken.append(method.__name__)
            state["tracing"] = False  # as inside torch.compiler.disable
            try:
                return method(*args, **kwargs)
            finally:
                state["tracing"] = True
        return run

    monkeypatch.setattr(recorder_module, "_is_compiling", lambda: state["tracing"])
    monkeypatch.setattr(recorder_module, "_untraced", untraced)
    return taken


def _one_step(recorder: Any, model: Any, x: torch.Tensor, step: int, *, dynamic: bool) -> None:
    recorder.start_batch(step, 4, type_of_execution=None if dynamic else "main_execution_type")
    recorder.start_iteration()
    recorder.register_tensor("x", x, is_input=True)
    hidden = model[0](x)
    detached = recorder.detach_while_keeping_connection(hidden)
    output = model[2](torch.tanh(detached))
    recorder.register_tensor("output", output)
    recorder.add_tensor_connection("x", "output")
    loss = (output ** 2).mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    loss.backward()
    recorder.record_current_gradients("gradients")
    recorder.record_kpi_in_graph("kpis", "loss", loss.detach())
    recorder.finish_iteration()
    if dynamic:
        recorder.decide_recording_of_batch("main_execution_type", ["a"] * 4)
    recorder.finish_batch()


def test_every_entry_point_leaves_a_traced_frame_and_records_as_eagerly(
        simulated_trace: list[str], make_recorder: Any, open_trial: Any, tiny_model: Any, generator: Any) -> None:
    recorder = make_recorder({0, 1})
    recorder.track_module("net", tiny_model)
    recorder.track_optimizer(torch.optim.SGD(tiny_model.parameters(), lr=0.1))
    recorder.set_sentinels(["loss"])
    recorder.add_note("traced")
    recorder.record_hyperparameters({"lr": 0.1})
    x = torch.randn(4, 3, generator=generator)
    _one_step(recorder, tiny_model, x, 0, dynamic=False)
    _one_step(recorder, tiny_model, x, 1, dynamic=True)
    assert recorder.abandon_step() is False  # (no step open: it only has to leave the traced frame)
    recorder.flush()
    recorder.finalize()
    assert set(simulated_trace) == set(recorder_module._ENTRY_POINTS)
    trial = open_trial()
    assert trial.steps()["training_step"].to_pylist() == [0, 1]
    rows = trial.selection(training_step=1, kind="forward").to_pylist()
    (mean_row,) = [r for r in rows if r["tensor_name"] == "output" and r["aggregation"] == "mean"]
    with torch.no_grad():
        expected = tiny_model(x).double().mean().item()
    assert mean_row["mean"] == pytest.approx(expected, rel=1e-5)
    assert {"net.0.weight", "x", "loss"} <= {r["tensor_name"] for r in rows}


def test_on_a_step_that_takes_no_tensors_the_forwards_calls_trace_to_nothing(
        simulated_trace: list[str], make_recorder: Any, tiny_model: Any, generator: Any) -> None:
    recorder = make_recorder(set())
    x = torch.randn(4, 3, generator=generator)
    recorder.start_batch(0, 4)  # the loop's calls are outside the compiled model: here they take the way out
    simulated_trace.clear()
    recorder.register_tensor("x", x, is_input=True)  # these are the ones inside a compiled forward
    hidden = recorder.detach_while_keeping_connection(tiny_model(x))
    recorder.add_tensor_connection("x", hidden)
    recorder.record_kpi_in_graph("kpis", "value", 1.0)
    assert simulated_trace == [] and not hidden.requires_grad
    recorder.record_kpi_in_graph("kpis", "value", 1.0, record_even_if_recording_is_inactive=True)
    assert simulated_trace == ["record_kpi_in_graph"]  # wanted on every step: it leaves the trace

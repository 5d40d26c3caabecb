"""Dependency-graph edges, node by node, for small models of different shapes."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")

from comgra.capture.session import ComgraWarning
from comgra.recorder import ComgraRecorder

B = 4


def _linear(m: torch.nn.Module, name: str, n_in: int, n_out: int) -> None:
    m.add_module(name, torch.nn.Linear(n_in, n_out))


def _finish_with_loss(recorder: ComgraRecorder, prediction: torch.Tensor) -> None:
    target = torch.zeros_like(prediction)
    recorder.register_tensor("target", target, is_target=True)
    loss = ((prediction - target) ** 2).mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    loss.backward()
    recorder.record_current_gradients("gradients")


def mlp(recorder: ComgraRecorder, m: torch.nn.Module, generator: torch.Generator) -> None:
    x = torch.randn(B, 3, generator=generator)
    recorder.register_tensor("x", x, is_input=True)
    hidden = torch.relu(m.l0(x))
    recorder.register_tensor("hidden", hidden)
    y = m.l1(hidden)
    recorder.register_tensor("y", y)
    _finish_with_loss(recorder, y)


def residual(recorder: ComgraRecorder, m: torch.nn.Module, generator: torch.Generator) -> None:
    x = torch.randn(B, 3, generator=generator)
    recorder.register_tensor("x", x, is_input=True)
    block = m.l0(x)
    recorder.register_tensor("block", block)
    y = x + block
    recorder.register_tensor("y", y)
    _finish_with_loss(recorder, y)


def detach_keeping_connection(recorder: ComgraRecorder, m: torch.nn.Module, generator: torch.Generator) -> None:
    x = torch.randn(B, 3, generator=generator)
    recorder.register_tensor("x", x, is_input=True)
    a = m.l0(x)
    recorder.register_tensor("a", a)
    b = m.l1(recorder.detach_while_keeping_connection(a))
    recorder.register_tensor("b", b)
    _finish_with_loss(recorder, b)


def detach_and_manual_connection(recorder: ComgraRecorder, m: torch.nn.Module, generator: torch.Generator) -> None:
    x = torch.randn(B, 3, generator=generator)
    recorder.register_tensor("x", x, is_input=True)
    a = m.l0(x)
    recorder.register_tensor("a", a)
    c = a.detach() * 2
    recorder.register_tensor("c", c)
    recorder.add_tensor_connection("a", c)
    _finish_with_loss(recorder, c + m.l1(x))


def integer_replacement_connection(recorder: ComgraRecorder, m: torch.nn.Module,
                                   generator: torch.Generator) -> None:
    """The README's pattern for integer tensors: register a float copy, connect it by hand."""
    x = torch.randn(B, 3, generator=generator)
    recorder.register_tensor("x", x, is_input=True)
    labels = torch.randint(0, 3, (B, 3), generator=generator)
    recorder.register_tensor("labels", labels.float())
    scaled = m.l0(x) * labels
    recorder.register_tensor("scaled", scaled)
    recorder.add_tensor_connection("labels", scaled)
    _finish_with_loss(recorder, scaled)


@dataclass
class Case:
    body: Callable[[ComgraRecorder, torch.nn.Module, torch.Generator], None]
    layers: dict[str, tuple[int, int]]
    edges: set[tuple[str, str]]
    roles: dict[str, str]


def _params(layer: str) -> list[str]:
    return [f"m.{layer}.weight", f"m.{layer}.bias"]


CASES = {
    "mlp": Case(mlp, {"l0": (3, 5), "l1": (5, 2)},
                {("x", "hidden"), *((p, "hidden") for p in _params("l0")), ("hidden", "y"),
                 *((p, "y") for p in _params("l1")), ("y", "loss"), ("target", "loss")},
                {"x": "input", "hidden": "intermediate", "y": "output", "target": "target", "loss": "loss",
                 **{p: "parameter" for p in _params("l0") + _params("l1")}}),
    "residual": Case(residual, {"l0": (3, 3)},
                     {("x", "block"), *((p, "block") for p in _params("l0")), ("x", "y"), ("block", "y"),
                      ("y", "loss"), ("target", "loss")},
                     {"x": "input", "block": "intermediate", "y": "output", "target": "target", "loss": "loss",
                      **{p: "parameter" for p in _params("l0")}}),
    "detach_while_keeping_connection": Case(
        detach_keeping_connection, {"l0": (3, 3), "l1": (3, 2)},
        {("x", "a"), *((p, "a") for p in _params("l0")), ("a", "b"), *((p, "b") for p in _params("l1")),
         ("b", "loss"), ("target", "loss")},
        {"x": "input", "a": "intermediate", "b": "output", "target": "target", "loss": "loss",
         **{p: "parameter" for p in _params("l0") + _params("l1")}}),
    "detach_plus_add_tensor_connection": Case(
        detach_and_manual_connection, {"l0": (3, 3), "l1": (3, 3)},
        # c + l1(x) is not registered: the loss depends on c, and on x and l1 through it.
        {("x", "a"), *((p, "a") for p in _params("l0")), ("a", "c"), ("c", "loss"), ("x", "loss"),
         *((p, "loss") for p in _params("l1")), ("target", "loss")},
        {"x": "input", "a": "intermediate", "c": "output", "target": "target", "loss": "loss",
         **{p: "parameter" for p in _params("l0") + _params("l1")}}),
    "integer_tensor_replaced_and_connected": Case(
        integer_replacement_connection, {"l0": (3, 3)},
        {("x", "scaled"), *((p, "scaled") for p in _params("l0")), ("labels", "scaled"), ("scaled", "loss"),
         ("target", "loss")},
        {"x": "input", "labels": "intermediate", "scaled": "output", "target": "target", "loss": "loss",
         **{p: "parameter" for p in _params("l0")}}),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_edges_and_roles_of_small_models(case: Case, make_recorder, open_trial, generator, edges,
                                         node_roles) -> None:
    model = torch.nn.Module()
    for name, (n_in, n_out) in case.layers.items():
        _linear(model, name, n_in, n_out)
    recorder = make_recorder({0})
    recorder.track_module("m", model)
    recorder.start_batch(0, B)
    recorder.start_iteration()
    case.body(recorder, model, generator)
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    trial = open_trial()
    assert edges(trial, 0, 0) == case.edges
    assert node_roles(trial, 0, 0) == case.roles


def test_plain_detach_cuts_the_edge_and_warns_once(make_recorder, open_trial, generator, edges) -> None:
    model = torch.nn.Linear(3, 3)
    recorder = make_recorder({0, 1})
    recorder.track_module("m", model)
    for step in (0, 1):
        recorder.start_batch(step, B)
        recorder.start_iteration()
        x = torch.randn(B, 3, generator=generator)
        recorder.register_tensor("x", x, is_input=True)
        a = model(x)
        recorder.register_tensor("a", a)
        recorder.register_tensor("c", a.detach() * 2)
        if step == 0:
            with pytest.warns(ComgraWarning, match=r"'c' has no connection.*add_tensor_connection"):
                recorder.finish_iteration()
        else:
            recorder.finish_iteration()  # the same advice is not repeated on every step
        recorder.finish_batch()
    recorder.finalize()
    assert edges(open_trial(), 0, 0) == {("x", "a"), ("m.weight", "a"), ("m.bias", "a")}


class Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.Linear(3 + 4, 4)
        self.out = torch.nn.Linear(4, 2)


def test_recurrent_memory_feeds_the_next_iteration(make_recorder, open_trial, generator, edges, graph) -> None:
    model = Recurrent()
    recorder = make_recorder({0}, prefixes_for_grouping_module_parameters_in_nodes=["m.cell"])
    recorder.track_module("m", model)
    recorder.start_batch(0, B)
    memory = torch.zeros(B, 4)
    recorder.register_tensor("initial_memory", memory, is_initial_value=True)
    for iteration in range(3):
        recorder.start_iteration()
        x = torch.randn(B, 3, generator=generator)
        recorder.register_tensor("x", x, is_input=True)
        memory = torch.tanh(model.cell(torch.cat([x, memory], dim=1)))
        recorder.register_tensor("memory", memory)
        if iteration == 2:
            y = model.out(memory)
            recorder.register_tensor("y", y)
            _finish_with_loss(recorder, y)
        recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    trial = open_trial()

    assert edges(trial, 0, 0) == {("initial_memory", "memory"), ("x", "memory"), ("m.cell", "memory")}
    assert edges(trial, 0, 1) == {("memory*old", "memory"), ("x", "memory"), ("m.cell", "memory")}
    assert edges(trial, 0, 2) == {("memory*old", "memory"), ("x", "memory"), ("m.cell", "memory"),
                                  ("memory", "y"), ("m.out.weight", "y"), ("m.out.bias", "y"),
                                  ("y", "loss"), ("target", "loss")}
    nodes = {n["id"]: n for n in graph(trial, 0, 1)["nodes"]}
    assert nodes["memory*old"]["iteration_offset"] == -1
    assert nodes["memory*old"]["node"] == "memory"
    assert nodes["memory"]["iteration_offset"] == 0
    initial = {n["id"]: n for n in graph(trial, 0, 0)["nodes"]}["initial_memory"]
    assert (initial["role"], initial["absolute_iteration"]) == ("initial_value", -1)
    # The gradient reaches every iteration's memory and the initial value.
    rows = trial.selection(training_step=0, kind="gradients", node="memory", aggregation="mean")
    assert sorted(rows["iteration"].to_pylist()) == [0, 1, 2]
    assert trial.selection(training_step=0, kind="gradients", node="initial_memory").num_rows > 0


def test_memory_from_two_iterations_back_gets_its_own_node(make_recorder, open_trial, generator, edges,
                                                           graph) -> None:
    model = torch.nn.Linear(4, 4)
    recorder = make_recorder({0})
    recorder.track_module("m", model)
    recorder.start_batch(0, B)
    history = []
    for iteration in range(3):
        recorder.start_iteration()
        x = torch.randn(B, 4, generator=generator)
        recorder.register_tensor("x", x, is_input=True)
        state = model(x) + (history[-2] if len(history) >= 2 else 0)
        recorder.register_tensor("state", state)
        history.append(state)
        recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    trial = open_trial()
    assert edges(trial, 0, 2) == {("x", "state"), ("m.weight", "state"), ("m.bias", "state"),
                                  ("state*old2", "state")}
    old = {n["id"]: n for n in graph(trial, 0, 2)["nodes"]}["state*old2"]
    assert old["iteration_offset"] == -2


def test_same_tensor_registered_under_two_names_is_an_alias(make_recorder, open_trial, generator, edges) -> None:
    model = torch.nn.Linear(3, 3)
    recorder = make_recorder({0})
    recorder.track_module("m", model)
    recorder.start_batch(0, B)
    recorder.start_iteration()
    x = torch.randn(B, 3, generator=generator)
    recorder.register_tensor("x", x, is_input=True)
    y = model(x)
    recorder.register_tensor("y", y)
    recorder.register_tensor("y_again", y)
    z = y * 2
    recorder.register_tensor("z", z)
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    assert edges(open_trial(), 0, 0) == {("x", "y"), ("m.weight", "y"), ("m.bias", "y"), ("y", "y_again"),
                                         ("y", "z")}

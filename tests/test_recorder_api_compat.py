"""The documented Comgra API runs unchanged: the minimal example of docs/usage.md and the tutorial's pattern."""
# docs/usage.md's example is copied verbatim, style included.
# ruff: noqa: I001, PLR0402, UP008, F541
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import comgra
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder
from comgra.store import GroupReader


def test_readme_minimal_example_runs_unchanged(tmp_path: Path) -> None:
    # ---- copied from docs/usage.md; only comgra_root_path differs ----------------------------
    import torch
    import torch.nn as nn
    import torch.optim as optim
    import comgra
    from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
    from comgra.recorder import ComgraRecorder

    # Define a simple model
    class SimpleModel(nn.Module):
        def __init__(self):
            super(SimpleModel, self).__init__()
            self.layer0 = nn.Linear(5, 5)
            self.layer1 = nn.Linear(5, 5)

        def forward(self, x):
            x = self.layer0(x)
            return self.layer1(x)

    # Initialize comgra
    comgra.my_recorder = ComgraRecorder(
        comgra_root_path=str(tmp_path / "data"),
        group="name_of_experiment_group",
        trial_id="example_trial",
        decision_maker_for_recordings=DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10),
    )
    comgra.my_recorder.add_note("This is an optional log message that will show up in the 'Notes' tab.")

    # Create model, loss function, and optimizer
    model = SimpleModel()
    criterion = nn.MSELoss()
    optimizer = optim.SGD(model.parameters(), lr=0.01)
    comgra.my_recorder.track_module("main_model", model)

    # Generate some dummy data
    inputs = torch.randn(100, 5)
    targets = 2 * inputs + torch.randn(100, 5) * 0.1

    # Training loop
    num_epochs = 100
    for epoch in range(num_epochs):
        comgra.my_recorder.start_batch(epoch, inputs.shape[0])
        comgra.my_recorder.start_iteration()
        # Forward
        comgra.my_recorder.register_tensor("inputs", inputs, is_input=True)
        outputs = model(inputs)
        comgra.my_recorder.register_tensor("outputs", outputs)
        comgra.my_recorder.register_tensor("targets", targets, is_target=True)
        loss = criterion(outputs, targets)
        comgra.my_recorder.register_tensor("loss", loss, is_loss=True)
        comgra.my_recorder.record_kpi_in_graph("loss", "", loss)
        # Backward
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        comgra.my_recorder.record_current_gradients(f"gradients")
        comgra.my_recorder.finish_iteration()
        comgra.my_recorder.finish_batch()
    comgra.my_recorder.finalize()
    # ---- end of the docs/usage.md example -------------------------------------------------------

    trial = GroupReader(tmp_path / "data" / "name_of_experiment_group").trial("example_trial")
    steps = trial.steps()
    assert steps.column("training_step").to_pylist() == list(range(0, 100, 10))
    assert set(steps.column("iteration").to_pylist()) == {0}
    assert set(steps.column("type_of_execution").to_pylist()) == {"main_execution_type"}
    assert all(kinds == ["forward", "gradients"] for kinds in steps.column("kinds").to_pylist())

    parameters = {f"main_model.layer{i}.{p}" for i in (0, 1) for p in ("weight", "bias")}
    graph = trial.graph(steps.column("graph")[0].as_py())
    roles = {n["id"]: n["role"] for n in graph["nodes"]}
    assert roles == {"inputs": "input", "targets": "target", "loss": "loss", "outputs": "output",
                     **{p: "parameter" for p in parameters}}
    assert {(e["source"], e["target"]) for e in graph["edges"]} == {
        ("inputs", "outputs"), ("outputs", "loss"), ("targets", "loss"), *((p, "outputs") for p in parameters)}

    rows = trial.selection(training_step=90, columns=["kind", "node", "tensor_type", "aggregation"])
    forward = {(n, t) for k, n, t in zip(*(rows[c].to_pylist() for c in ("kind", "node", "tensor_type")))
               if k == "forward"}
    assert forward == {("inputs", "input"), ("outputs", "calculated"), ("targets", "target"), ("loss", "loss"),
                       *((p, "parameter") for p in parameters)}
    gradient_nodes = {n for k, n in zip(rows["kind"].to_pylist(), rows["node"].to_pylist()) if k == "gradients"}
    assert gradient_nodes == {"inputs", "outputs", "targets", "loss", *parameters}
    assert set(rows["aggregation"].to_pylist()) == {"mean", "std", "abs_max", "sample", "none"}

    kpis = trial.kpis()
    assert kpis.column("timepoint").to_pylist() == list(range(0, 100, 10))
    assert set(kpis.column("kpi_group").to_pylist()) == {"loss"}
    assert trial.notes() == ["This is an optional log message that will show up in the 'Notes' tab."]


class RecurrentNet(torch.nn.Module):
    """The tutorial's shape in miniature: a memory that feeds the next iteration, a readout at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.subnet_pre = torch.nn.Linear(3 + 4, 4)
        self.subnet_out = torch.nn.Linear(4, 2)


def _tutorial_step(recorder: ComgraRecorder, model: RecurrentNet, step: int, length: int,
                   generator: torch.Generator) -> None:
    batch = 6
    inputs = torch.rand(length, batch, 3, generator=generator) * 2 - 1
    target = (inputs.sum(0)[:, :2] > 0).float()
    recorder.start_batch(step, batch, type_of_execution=f"{length:02d}_iterations")
    memory = torch.zeros(batch, 4)
    recorder.register_tensor("initial_memory", memory, is_initial_value=True)
    for iteration in range(length):
        recorder.start_iteration()
        x = inputs[iteration].clone()
        recorder.register_tensor("input", x, is_input=True)
        recorder.register_tensor("helper__doubled", x * 2, node_name="helper", role_within_node="doubled")
        recorder.register_tensor("helper__total", x.sum(1, keepdim=True), node_name="helper",
                                 role_within_node="total")
        memory = torch.tanh(model.subnet_pre(torch.cat([x, memory], dim=1)))
        recorder.register_tensor("memory", memory)
        if iteration == length - 1:
            output = torch.sigmoid(model.subnet_out(memory))
            recorder.register_tensor("output", output)
            recorder.register_tensor("target", target, is_target=True)
            loss = torch.nn.functional.binary_cross_entropy(output, target)
            recorder.register_tensor("loss", loss, is_loss=True)
            loss.backward()
            recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
    recorder.finish_batch()


def test_tutorial_pattern_records_iterations_nodes_roles_and_kinds(store_root: Path, open_trial,
                                                                  generator: torch.Generator, edges,
                                                                  node_roles, graph) -> None:
    prefixes = ["main_model.subnet_pre", "main_model.subnet_out"]
    comgra.my_recorder = ComgraRecorder(
        store_root, "group", "trial",
        DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=4),
        max_num_batch_size_to_record=2,
        prefixes_for_grouping_module_parameters_visually=prefixes,
        prefixes_for_grouping_module_parameters_in_nodes=prefixes,
    )
    model = RecurrentNet()
    comgra.my_recorder.track_module("main_model", model)
    for step in range(6):
        _tutorial_step(comgra.my_recorder, model, step, 2 + step % 2, generator)
    comgra.my_recorder.finalize()

    trial = open_trial()
    index = [(r["training_step"], r["iteration"], r["type_of_execution"], r["samples"])
             for r in trial.steps().to_pylist()]
    assert index == [(0, 0, "02_iterations", [0, 1]), (0, 1, "02_iterations", [0, 1]),
                     (1, 0, "03_iterations", [0, 1]), (1, 1, "03_iterations", [0, 1]),
                     (1, 2, "03_iterations", [0, 1]),
                     (4, 0, "02_iterations", [0, 1]), (4, 1, "02_iterations", [0, 1]),
                     (5, 0, "03_iterations", [0, 1]), (5, 1, "03_iterations", [0, 1]),
                     (5, 2, "03_iterations", [0, 1])]
    assert trial.metadata["types_of_execution"] == ["02_iterations", "03_iterations"]

    pre, out = prefixes
    assert edges(trial, 1, 0) == {("initial_memory", "memory"), ("input", "memory"), (pre, "memory"),
                                  ("input", "helper")}
    assert edges(trial, 1, 1) == {("memory*old", "memory"), ("input", "memory"), (pre, "memory"),
                                  ("input", "helper")}
    assert edges(trial, 1, 2) == {("memory*old", "memory"), ("input", "memory"), (pre, "memory"),
                                  ("input", "helper"), ("memory", "output"), (out, "output"),
                                  ("output", "loss"), ("target", "loss")}
    assert node_roles(trial, 1, 2) == {"input": "input", "helper": "intermediate", "memory*old": "intermediate",
                                       "memory": "intermediate", "output": "output", "target": "target",
                                       "loss": "loss", pre: "parameter", out: "parameter"}
    assert node_roles(trial, 1, 0)["initial_memory"] == "initial_value"
    last = {n["id"]: n for n in graph(trial, 1, 2)["nodes"]}
    assert sorted(last["helper"]["roles"]) == ["doubled", "total"]
    assert sorted(last[pre]["roles"]) == [f"{pre}.bias", f"{pre}.weight"]
    assert last["memory*old"]["iteration_offset"] == -1

    rows = trial.selection(training_step=1, aggregation="mean").to_pylist()
    seen = {(r["kind"], r["iteration"], r["node"], r["role"], r["tensor_type"]) for r in rows}
    assert ("forward", -1, "initial_memory", "initial_memory", "initial_value") in seen
    assert {("forward", i, "helper", role, "calculated") for i in range(3) for role in ("doubled", "total")} <= seen
    assert ("gradients", 2, "output", "output", "calculated") in seen
    parameter_rows = trial.selection(training_step=1, node=pre, aggregation="none").to_pylist()
    assert {(r["kind"], r["iteration"], r["role"], r["tensor_type"]) for r in parameter_rows} == {
        (kind, -1, f"{pre}.{name}", "parameter") for kind in ("forward", "gradients") for name in ("weight", "bias")}
    assert {r["sample"] for r in trial.selection(training_step=1, aggregation="sample").to_pylist()} == {0, 1}

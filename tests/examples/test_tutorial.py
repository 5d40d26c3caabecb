"""The tutorial network, recorded by our recorder: the graph the README's walk-through relies on."""
from __future__ import annotations

import warnings

import pytest

from comgra.capture.session import ComgraWarning
from comgra.store import GroupReader

pytest.importorskip("torch")
from comgra.examples.tutorial import TRIALS, run_tutorial  # noqa: E402


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory):
    root = tmp_path_factory.mktemp("tutorial")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        group = run_tutorial(root, steps=60, min_training_steps_difference=20, hidden_size=16, progress=False)
    # The demo records this network: it must not warn about its own tensors (the helpers are connected).
    assert [str(w.message) for w in caught if issubclass(w.category, ComgraWarning)] == []
    return GroupReader(group)


def _node_edges(document):
    return {(e["source"], e["target"]) for e in document["edges"]}


def test_both_trials_are_recorded_with_all_types_of_step(tutorial):
    assert tutorial.trials() == sorted(TRIALS)
    for trial_id in TRIALS:
        trial = tutorial.trial(trial_id)
        steps = trial.steps()
        assert steps.num_rows > 0
        assert set(steps["type_of_execution"].to_pylist()) <= {f"{n:02d}_iterations" for n in (*range(1, 11), 15, 20)}
        assert trial.kpis().num_rows >= 60  # recorded on every step, not only on recorded ones
        assert len(trial.notes()) >= 2


def test_dependency_graph_of_the_last_iteration_is_the_named_chain(tutorial):
    trial = tutorial.trial(TRIALS[0])
    steps = trial.steps().to_pylist()
    longest = max(steps, key=lambda r: (r["iteration"], r["training_step"]))
    assert longest["iteration"] >= 1, "the test needs a recorded step with two or more iterations"
    document = trial.graph(longest["graph"])
    edges = _node_edges(document)
    chain = ["input", "subnet_pre__hidden_state", "subnet_out__out", "output", "loss_per_sample", "loss"]
    for source, target in zip(chain, chain[1:]):
        assert (source, target) in edges, (source, target, sorted(edges))
    assert ("subnet_pre__hidden_state", "subnet_mem__memory") in edges
    assert ("subnet_mem__memory*old", "subnet_pre__hidden_state") in edges  # memory feeds the next iteration
    roles = {n["id"]: n["role"] for n in document["nodes"]}
    assert roles["input"] == "input" and roles["loss"] == "loss" and roles["target"] == "target"
    assert roles["main_model.subnet_pre"] == "parameter"
    assert roles["output"] == "output" and roles["loss_per_sample"] == "intermediate"
    helper = next(n for n in document["nodes"] if n["id"] == "helper_partial_sums")
    assert set(helper["roles"]) == {"partial_sums", "remaining_sums", "final_sums"}
    columns = {n["id"]: n["column"] for n in document["nodes"]}
    assert columns["input"] < columns["subnet_pre__hidden_state"] < columns["output"] < columns["loss"]


def test_first_iteration_starts_from_the_initial_memory_and_has_no_loss(tutorial):
    trial = tutorial.trial(TRIALS[0])
    rows = [r for r in trial.steps().to_pylist() if r["iteration"] == 0]
    multi = {r["training_step"] for r in trial.steps().to_pylist() if r["iteration"] > 0}
    first = next(r for r in rows if r["training_step"] in multi)
    document = trial.graph(first["graph"])
    ids = {n["id"] for n in document["nodes"]}
    assert "loss" not in ids
    assert ("initial_memory", "subnet_pre__hidden_state") in _node_edges(document)


def test_values_and_gradients_are_stored_for_the_selected_tensor(tutorial):
    trial = tutorial.trial(TRIALS[0])
    step = trial.steps()["training_step"][0].as_py()
    forward = trial.selection(training_step=step, node="output", kind="forward", aggregation="sample").to_pylist()
    assert len(forward) == 5  # max_num_batch_size_to_record=5
    assert all(0.0 <= r["min"] <= r["max"] <= 1.0 for r in forward)  # after a sigmoid
    gradients = trial.selection(training_step=step, node="subnet_out__out", kind="gradients").to_pylist()
    assert gradients and all(r["abs_max"] > 0 for r in gradients if r["aggregation"] == "mean")

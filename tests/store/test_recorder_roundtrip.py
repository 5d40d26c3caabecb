"""What was registered is what the reader returns: values, neurons, shapes, and series across steps."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def test_registered_values_come_back_from_selection_and_series(make_recorder, open_trial, generator) -> None:
    recorder = make_recorder({0, 2, 4}, max_num_neurons_to_record=6, max_num_batch_size_to_record=2)
    registered: dict[int, dict[str, torch.Tensor]] = {}
    for step in range(5):
        recorder.start_batch(step, 3)
        recorder.start_iteration()
        x = torch.randn(3, 2, 2, generator=generator)
        recorder.register_tensor("x", x, is_input=True)
        y = (x * step).sum(-1)
        recorder.register_tensor("y", y, node_name="y_node", role_within_node="summed")
        recorder.finish_iteration()
        recorder.finish_batch()
        if recorder.session is not None and step in (0, 2, 4):
            registered[step] = {"x": x.detach().clone(), "y": y.detach().clone()}
    recorder.finalize()
    trial = open_trial()
    assert sorted(registered) == [0, 2, 4]

    for step, tensors in registered.items():
        x_rows = {r["sample"]: r for r in trial.selection(training_step=step, node="x", aggregation="sample")
                  .to_pylist()}
        assert sorted(x_rows) == [0, 1]  # max_num_batch_size_to_record=2
        for k, row in x_rows.items():
            assert row["shape"] == [3, 2, 2] and row["num_neurons"] == 4
            assert row["neurons"] == tensors["x"][k].reshape(-1).tolist()
            assert row["mean"] == pytest.approx(tensors["x"][k].mean().item(), rel=1e-6, abs=1e-7)
        (y_mean,) = trial.selection(training_step=step, node="y_node", role="summed", aggregation="mean").to_pylist()
        assert (y_mean["tensor_name"], y_mean["shape"]) == ("y", [3, 2])
        np.testing.assert_allclose(y_mean["neurons"], tensors["y"].mean(0).numpy(), rtol=1e-6, atol=1e-7)

    series = trial.series(node="x", role="x", iteration=0, aggregation="sample", sample=1, statistic="max")
    assert series.column_names == ["training_step", "value", "rank"]
    assert series["training_step"].to_pylist() == [0, 2, 4]
    assert series["value"].to_pylist() == pytest.approx([registered[s]["x"][1].max().item() for s in (0, 2, 4)])
    y_series = trial.series(node="y_node", role="summed", iteration=0, statistic="abs_mean")
    assert y_series["value"].to_pylist() == pytest.approx(
        [registered[s]["y"].abs().mean().item() for s in (0, 2, 4)], rel=1e-5)
    assert trial.selection(training_step=1).num_rows == 0


def test_record_per_batch_index_false_keeps_only_batch_statistics(make_recorder, open_trial, generator) -> None:
    recorder = make_recorder({0, 1})
    for step, default in ((0, True), (1, False)):
        recorder.start_batch(step, 3, record_all_tensors_per_batch_index_by_default=default)
        recorder.start_iteration()
        x = torch.randn(3, 2, generator=generator)
        recorder.register_tensor("x", x, is_input=True)
        recorder.register_tensor("y", x * 2, record_per_batch_index=not default)
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    trial = open_trial()

    def aggregations(step: int, node: str) -> set[str]:
        return set(trial.selection(training_step=step, node=node)["aggregation"].to_pylist())

    assert aggregations(0, "x") == {"mean", "std", "abs_max", "sample"}
    assert aggregations(0, "y") == {"mean", "std", "abs_max"}
    assert aggregations(1, "x") == {"mean", "std", "abs_max"}
    assert aggregations(1, "y") == {"mean", "std", "abs_max", "sample"}


def test_parameters_with_and_without_svd(make_recorder, open_trial) -> None:
    # Off by default (opt-in, issue 34: no detector reads them, and they cost half of a small model's recorded step).
    for trial_id, with_svd in (("svd", True), ("no_svd", False), ("default", None)):
        model = torch.nn.Linear(3, 2)
        recorder = make_recorder({0}, trial_id=trial_id, **({} if with_svd is None else {
            "calculate_svd_and_other_expensive_operations_of_parameters": with_svd}))
        recorder.track_module("m", model)
        recorder.start_batch(0, 1)
        recorder.finish_batch()
        recorder.finalize()
        rows = {r["node"]: r for r in open_trial(trial_id).selection(training_step=0).to_pylist()}
        assert set(rows) == {"m.weight", "m.bias"}
        weight = rows["m.weight"]
        assert (weight["aggregation"], weight["iteration"], weight["tensor_type"]) == ("none", -1, "parameter")
        assert weight["shape"] == [2, 3] and weight["num_neurons"] == 6
        # abs: six values of about 0.5 can sum to near 0, where a float32 mean is exact to ~1e-8 only, not to rel 1e-6
        assert weight["mean"] == pytest.approx(model.weight.detach().mean().item(), rel=1e-6, abs=1e-7)
        expected = torch.linalg.matrix_norm(model.weight.detach(), ord=2).item() if with_svd else None
        if with_svd:
            assert weight["svd_max"] == pytest.approx(expected, rel=1e-5)
        else:
            assert np.isnan(weight["svd_max"])
        assert np.isnan(rows["m.bias"]["svd_max"])

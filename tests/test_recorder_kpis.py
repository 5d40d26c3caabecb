"""KPIs (record_kpi_in_graph) and notes (add_note)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from comgra.errors import RecordingError


def _run(recorder, steps: range, **kpi_kwargs) -> list[float]:
    values = []
    for step in steps:
        recorder.start_batch(step, 2)
        value = step * 0.5
        recorder.record_kpi_in_graph("loss", "train", value, **kpi_kwargs)
        values.append(value)
        recorder.finish_batch()
    recorder.finalize()
    return values


@pytest.mark.parametrize(("even_if_inactive", "expected_steps"), [(True, list(range(12))), (False, [0, 5, 10])],
                         ids=["every_step", "recorded_steps_only"])
def test_kpis_on_every_step_or_only_on_recorded_steps(even_if_inactive, expected_steps, make_recorder,
                                                      open_trial) -> None:
    recorder = make_recorder({0, 5, 10})
    _run(recorder, range(12), record_even_if_recording_is_inactive=even_if_inactive)
    kpis = open_trial().kpis().to_pylist()
    assert [k["timepoint"] for k in kpis] == expected_steps
    assert [k["value"] for k in kpis] == [s * 0.5 for s in expected_steps]
    assert {(k["kpi_group"], k["kpi_name"], k["type_of_execution"]) for k in kpis} == {
        ("loss", "train", "main_execution_type")}


VALUES = {
    "python_float": (0.25, 0.25),
    "python_int": (3, 3.0),
    "zero_dim_tensor": (torch.tensor(1.5), 1.5),
    "one_element_tensor": (torch.tensor([[2.5]]), 2.5),
    "float64_tensor": (torch.tensor(0.1, dtype=torch.float64), 0.1),
    "integer_tensor": (torch.tensor(7), 7.0),
    "bool_tensor": (torch.tensor(True), 1.0),
    "tensor_that_requires_grad": (torch.tensor(4.0, requires_grad=True) * 2, 8.0),
    "nan": (float("nan"), float("nan")),
}


@pytest.mark.parametrize(("value", "expected"), VALUES.values(), ids=VALUES.keys())
def test_kpi_values(value, expected, make_recorder, open_trial) -> None:
    recorder = make_recorder({0})
    recorder.start_batch(0, 1)
    recorder.record_kpi_in_graph("group", "name", value)
    recorder.finish_batch()
    recorder.finalize()
    (row,) = open_trial().kpis().to_pylist()
    assert row["value"] == pytest.approx(expected, rel=1e-6, nan_ok=True)


def test_many_tensor_kpis_reach_the_store_in_order(make_recorder, open_trial) -> None:
    recorder = make_recorder(set())
    for step in range(600):  # more than one buffer's worth
        recorder.start_batch(step, 1)
        recorder.record_kpi_in_graph("loss", "train", torch.tensor(float(step)),
                                     record_even_if_recording_is_inactive=True)
        recorder.record_kpi_in_graph("accuracy", "train", step / 600, record_even_if_recording_is_inactive=True)
        recorder.finish_batch()
    recorder.finalize()
    kpis = open_trial().kpis()
    loss = [r for r in kpis.to_pylist() if r["kpi_group"] == "loss"]
    assert [r["timepoint"] for r in loss] == list(range(600))
    assert [r["value"] for r in loss] == [float(s) for s in range(600)]
    assert kpis.num_rows == 1200


def test_explicit_timepoint_and_kpis_outside_a_step(make_recorder, open_trial) -> None:
    recorder = make_recorder({0})
    with pytest.raises(RecordingError, match=r"record_kpi_in_graph\('eval', 'acc', \.\.\.\).*timepoint="):
        recorder.record_kpi_in_graph("eval", "acc", 0.5, record_even_if_recording_is_inactive=True)
    recorder.record_kpi_in_graph("eval", "acc", 0.5, timepoint=100, record_even_if_recording_is_inactive=True)
    recorder.start_batch(0, 1)
    recorder.record_kpi_in_graph("eval", "acc", 0.75, timepoint=200)
    recorder.finish_batch()
    recorder.finalize()
    assert [(r["timepoint"], r["value"]) for r in open_trial().kpis().to_pylist()] == [(100, 0.5), (200, 0.75)]


def test_kpis_per_type_of_execution(make_recorder, open_trial) -> None:
    recorder = make_recorder(set())
    for step in range(4):
        recorder.start_batch(step, 1, type_of_execution=f"{1 + step % 2:02d}_iterations")
        recorder.record_kpi_in_graph("loss", "bce", step, record_even_if_recording_is_inactive=True)
        recorder.finish_batch()
    recorder.finalize()
    rows = open_trial().kpis().to_pylist()
    assert [(r["timepoint"], r["type_of_execution"]) for r in rows] == [
        (0, "01_iterations"), (1, "02_iterations"), (2, "01_iterations"), (3, "02_iterations")]


def test_notes_are_kept_in_order_whether_or_not_a_step_is_recorded(make_recorder, open_trial) -> None:
    recorder = make_recorder({1})
    recorder.add_note("before training")
    for step in range(3):
        recorder.start_batch(step, 1)
        recorder.add_note(f"step {step}")
        recorder.finish_batch()
    recorder.add_note({"not": "a string"})
    recorder.finalize()
    assert open_trial().notes() == ["before training", "step 0", "step 1", "step 2", "{'not': 'a string'}"]

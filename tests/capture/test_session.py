"""A recorder's trial on disk: reusing a trial id, gradient groups, names that would collide in the graph."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from comgra.errors import RecordingError
from comgra.store import GroupReader


def _one_step(recorder, model, x: torch.Tensor) -> None:
    recorder.start_batch(0, x.shape[0])
    recorder.start_iteration()
    recorder.register_tensor("x", x, is_input=True)
    recorder.register_tensor("y", model(x))
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()


def test_reusing_a_trial_id_in_one_process_keeps_the_earlier_recording_beside_it(
        make_recorder, open_trial, store_root, tiny_model, capfd) -> None:
    """A notebook runs its recorder cell again: the trial id names the new run, the earlier runs stay readable."""
    for value in (1.0, 5.0, 7.0):
        _one_step(make_recorder({0}), tiny_model, torch.full((2, 3), value))
    assert "that recording is kept as trial 'trial~1'" in capfd.readouterr().err
    assert GroupReader(store_root / "group").trials() == ["trial", "trial~1", "trial~2"]
    means = {trial_id: open_trial(trial_id).selection(training_step=0, node="x", aggregation="mean")["mean"].to_pylist()
             for trial_id in ("trial", "trial~1", "trial~2")}
    assert means == {"trial": [7.0], "trial~1": [1.0], "trial~2": [5.0]}
    assert not (store_root / "group" / ".replaced").exists()
    kept = json.loads((store_root / "group" / "trials" / "trial~1" / "trial.json").read_text())
    assert (kept["trial_id"], kept["earlier_run_of"]) == ("trial~1", "trial")


def test_a_trial_of_another_process_is_moved_aside(make_recorder, open_trial, store_root, tiny_model, capfd) -> None:
    """A script run again (or a notebook after its kernel restarted) replaces the trial, as Comgra did; the
    earlier recording is moved to GROUP/.replaced/, not deleted."""
    script = textwrap.dedent(f"""
        import torch
        from comgra.objects import DecisionMakerForRecordingsHardcoded
        from comgra.recorder import ComgraRecorder
        recorder = ComgraRecorder({str(store_root)!r}, "group", "trial", DecisionMakerForRecordingsHardcoded({{0}}))
        recorder.start_batch(0, 2)
        recorder.start_iteration()
        recorder.register_tensor("x", torch.ones(2, 3), is_input=True)
        recorder.finish_iteration()
        recorder.finish_batch()
        recorder.finalize()
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    _one_step(make_recorder({0}), tiny_model, torch.full((2, 3), 5.0))
    assert "earlier recording of trial 'trial' was moved" in capfd.readouterr().err
    (current,) = open_trial().selection(training_step=0, node="x", aggregation="mean").to_pylist()
    assert current["mean"] == 5.0
    (earlier,) = (store_root / "group" / ".replaced").iterdir()
    assert earlier.name.startswith("trial-")
    # Format 3: the trial's table folders moved with it (<moved trial>/tensors/trial=trial/rank=0/).
    assert any((earlier / "tensors" / "trial=trial" / "rank=0").glob("*.parquet"))
    assert GroupReader(store_root / "group").trials() == ["trial"]


def test_gradient_groups_are_kept_apart(make_recorder, open_trial, tiny_model, generator) -> None:
    recorder = make_recorder({0})
    recorder.track_module("model", tiny_model)
    recorder.start_batch(0, 2)
    recorder.start_iteration()
    x = torch.randn(2, 3, generator=generator)
    recorder.register_tensor("x", x, is_input=True)
    y = tiny_model(x)
    recorder.register_tensor("y", y)
    y.sum().backward(retain_graph=True)
    recorder.record_current_gradients("sum_loss", set_gradients_to_zero_if_not_a_parameter=True)
    (3 * y.sum()).backward()
    recorder.record_current_gradients("triple_loss")
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    trial = open_trial()
    assert trial.steps()["kinds"].to_pylist() == [["forward", "sum_loss", "triple_loss"]]

    def y_gradient(kind: str) -> list[float]:
        (row,) = trial.selection(training_step=0, kind=kind, node="y", aggregation="sample", sample=0).to_pylist()
        return row["neurons"]

    assert y_gradient("sum_loss") == [1.0, 1.0]
    assert y_gradient("triple_loss") == [3.0, 3.0]  # zeroed after sum_loss, as the option says
    weight = {r["kind"]: r["mean"] for r in trial.selection(training_step=0, node="model.2.weight").to_pylist()}
    assert weight["triple_loss"] == pytest.approx(4 * weight["sum_loss"])  # parameters accumulate, as .grad does


def test_initial_value_and_iteration_tensor_may_not_share_a_node(make_recorder) -> None:
    recorder = make_recorder({0})
    recorder.start_batch(0, 2)
    recorder.register_tensor("memory", torch.zeros(2, 3), is_initial_value=True)
    recorder.start_iteration()
    with pytest.raises(RecordingError, match=r"Node 'memory'.*'initial_memory'"):
        recorder.register_tensor("memory", torch.ones(2, 3))


def test_record_current_gradients_without_backward_records_no_gradients(make_recorder, open_trial) -> None:
    recorder = make_recorder({0, 1})
    for step, backward in ((0, False), (1, True)):  # step 1 is the positive control: the same query finds rows
        recorder.start_batch(step, 2)
        recorder.start_iteration()
        x = torch.ones(2, 3)
        recorder.register_tensor("x", x, is_input=True)
        y = x * 2
        recorder.register_tensor("y", y)
        if backward:
            y.sum().backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    trial = open_trial()
    assert trial.selection(training_step=0, kind="gradients").num_rows == 0
    forward = {r["tensor_name"]: r["mean"] for r in trial.selection(training_step=0, kind="forward",
                                                                     aggregation="mean").to_pylist()}
    assert forward == {"x": 1.0, "y": 2.0}  # the step was recorded: only its gradients are missing
    gradients = {r["tensor_name"]: r["mean"] for r in trial.selection(training_step=1, kind="gradients",
                                                                       aggregation="mean").to_pylist()}
    assert gradients == {"x": 2.0, "y": 1.0}


def test_warnings_name_the_line_of_the_users_call(tmp_path) -> None:
    import torch

    from comgra.capture.session import ComgraWarning
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    recorder = ComgraRecorder(tmp_path, "group", "trial", DecisionMakerForRecordingsHardcoded({0}))
    recorder.start_batch(0, 2)
    recorder.start_iteration()
    with pytest.warns(ComgraWarning) as record:
        recorder.register_tensor("ids", torch.tensor([1, 2]))
        recorder.register_tensor("x", torch.randn(2, 3))
        recorder.finish_iteration()
    assert [w.filename for w in record] == [__file__, __file__]
    recorder.finish_batch()
    recorder.finalize()

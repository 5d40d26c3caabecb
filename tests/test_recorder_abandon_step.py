"""A step an exception interrupted (``abandon_step``, ``batch``), and a recorder made again for the same trial
while the earlier one is still open (a notebook cell run again)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import comgra
from comgra.errors import RecordingError
from comgra.store import GroupReader


class Interrupted(Exception):
    """What the user's code raised inside the step."""


def _full_step(recorder, step: int, model, x: torch.Tensor, *, kpi: float) -> torch.Tensor:
    recorder.start_batch(step, x.shape[0])
    recorder.start_iteration()
    recorder.register_tensor("x", x, is_input=True)
    y = model(x)
    recorder.register_tensor("y", y)
    loss = y.pow(2).mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    loss.backward()
    recorder.record_current_gradients("gradients")
    recorder.record_kpi_in_graph("loss", "train", kpi)
    recorder.finish_iteration()
    recorder.finish_batch()
    return y


def _half_step(recorder, step: int, model, x: torch.Tensor) -> None:
    """Registers tensors (one of them, "only_in_the_half_step", in no other step), a KPI point and a note, then
    raises inside the iteration."""
    recorder.start_batch(step, x.shape[0])
    recorder.start_iteration()
    recorder.register_tensor("x", x, is_input=True)
    y = model(x)
    recorder.register_tensor("y", y)
    recorder.register_tensor("only_in_the_half_step", y * 2)
    recorder.record_kpi_in_graph("loss", "train", -1.0)
    recorder.add_note("inside the half step")
    raise Interrupted("a mistake in the user's code")


def _means(trial, node: str) -> dict[int, float]:
    """{training_step: mean of ``node``'s values} over the steps of the trial."""
    steps = sorted(set(trial.steps()["training_step"].to_pylist()))
    return {s: trial.selection(training_step=s, node=node, kind="forward", aggregation="mean")["mean"][0].as_py()
            for s in steps}


def test_abandon_step_stores_nothing_of_the_half_step_and_the_step_can_be_recorded_again(
        make_recorder, open_trial, store_root, tiny_model, generator) -> None:
    recorder = make_recorder({0, 1})
    first, retried, half = (torch.randn(2, 3, generator=generator) for _ in range(3))
    _full_step(recorder, 0, tiny_model, first, kpi=0.5)
    with pytest.raises(Interrupted):
        _half_step(recorder, 1, tiny_model, half)
    with pytest.raises(RecordingError, match=r"abandon_step\(\) to drop a step"):
        recorder.start_batch(2, 2)
    assert recorder.abandon_step() is True
    assert half.requires_grad is False  # switched on for its gradient, switched off again as at finish_batch
    assert recorder.abandon_step() is False  # nothing open any more
    _full_step(recorder, 1, tiny_model, retried, kpi=0.25)  # the same step number: nothing of step 1 was stored
    recorder.finalize()

    trial = open_trial()
    assert sorted(zip(trial.steps()["training_step"].to_pylist(), trial.steps()["iteration"].to_pylist())) == \
        [(0, 0), (1, 0)]
    assert _means(trial, "x") == pytest.approx({0: first.mean().item(), 1: retried.mean().item()})
    assert [(k["timepoint"], k["value"]) for k in trial.kpis().to_pylist()] == [(0, 0.5), (1, 0.25)]
    assert trial.notes() == ["inside the half step"]  # a note is a log line, kept as print() output would be
    graphs = [json.loads(p.read_text()) for p in (store_root / "group" / "trials" / "trial" / "graphs").glob("*.json")]
    assert graphs and not any("only_in_the_half_step" in json.dumps(g) for g in graphs)
    assert set(trial.selection(training_step=1)["node"].to_pylist()) >= {"x", "y", "loss"}
    assert "only_in_the_half_step" not in set(trial.selection(training_step=1)["node"].to_pylist())


def test_batch_finishes_the_step_or_abandons_it_and_raises(make_recorder, open_trial, tiny_model,
                                                           generator) -> None:
    recorder = make_recorder({0, 1, 2})
    inputs = [torch.randn(2, 3, generator=generator) for _ in range(3)]
    def iteration(x: torch.Tensor) -> None:
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        recorder.register_tensor("y", tiny_model(x))
        recorder.finish_iteration()

    with recorder.batch(0, 2) as same:
        assert same is recorder
        iteration(inputs[0])
    with pytest.raises(Interrupted):
        with recorder.batch(1, 2):
            iteration(inputs[1])
            raise Interrupted("inside the with block")
    with recorder.batch(1, 2):
        iteration(inputs[2])
    recorder.finalize()
    assert _means(open_trial(), "x") == pytest.approx({0: inputs[0].mean().item(), 1: inputs[2].mean().item()})


def test_abandon_step_on_an_unrecorded_or_inactive_recorder(make_recorder, store_root) -> None:
    recorder = make_recorder({5})
    assert recorder.abandon_step() is False
    recorder.start_batch(0, 2)  # not recorded: abandoning it still closes it
    assert recorder.abandon_step() is True
    recorder.start_batch(0, 2)
    recorder.finish_batch()
    off = make_recorder({0}, trial_id="off", comgra_is_active=False)
    off.start_batch(0, 2)
    assert off.abandon_step() is False  # comgra off: there never was a step to drop
    assert not (store_root / "group" / "trials" / "off").exists()


def test_abandon_step_drops_the_profiled_layers_and_watch_hooks_of_the_half_step(make_recorder, open_trial,
                                                                                 tiny_model, generator) -> None:
    recorder = make_recorder({0, 1})
    recorder.track_module("model", tiny_model, profile=True)
    watched = comgra.watch(tiny_model, recorder=recorder, name="model")
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    x = torch.randn(2, 3, generator=generator)
    recorder.start_batch(0, 2)  # the first profiled step counts FLOPs: a dispatch mode is on until the step ends
    recorder.start_iteration()
    tiny_model(x)
    assert _get_current_dispatch_mode() is not None
    recorder.abandon_step()
    assert _get_current_dispatch_mode() is None  # the FLOP counter is off again, outside any step
    tiny_model(x)  # outside a step: the watch hooks are off, nothing registers
    _full_step(recorder, 0, tiny_model, x, kpi=0.0)
    _full_step(recorder, 1, tiny_model, x, kpi=0.0)
    watched.remove()
    recorder.finalize()
    layers = open_trial().layers().to_pylist()
    per_step = {step: sorted((r["module"], r["call"]) for r in layers if r["training_step"] == step) for step in (0, 1)}
    assert per_step[0] and per_step[1] == per_step[0]  # the half step's calls are not counted into step 1


def test_a_new_recorder_for_an_open_trial_finishes_the_earlier_one_and_keeps_its_steps(
        store_root, tiny_model, generator, capfd) -> None:
    """The notebook case: the earlier recorder holds its steps in its writer's buffer (flush_seconds=60) and is
    inside a step an exception interrupted, when the cell that makes the recorder runs again."""
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    def recorder() -> ComgraRecorder:
        return ComgraRecorder(store_root, "group", "trial", DecisionMakerForRecordingsHardcoded({0, 1, 2}),
                              flush_seconds=60.0)

    inputs = [torch.randn(2, 3, generator=generator) for _ in range(4)]
    earlier = recorder()
    for step in (0, 1):
        _full_step(earlier, step, tiny_model, inputs[step], kpi=float(step))
    group = GroupReader(store_root / "group")
    assert group.trials() == ["trial"]
    assert group.trial("trial").steps().num_rows == 0  # still in the writer's buffer; the app's reader is open
    with pytest.raises(Interrupted):
        _half_step(earlier, 2, tiny_model, inputs[2])

    later = recorder()
    _full_step(later, 0, tiny_model, inputs[3], kpi=9.0)
    later.finalize()
    earlier.finalize()  # already finished by the later one: nothing happens
    with pytest.raises(RecordingError, match=r"was finished when a new ComgraRecorder for the same trial was made "
                                             r"\(a notebook cell run again\); its steps are kept as trial 'trial~1'"):
        earlier.start_batch(5, 2)  # it would record into a closed trial
    assert "kept as trial 'trial~1'" in capfd.readouterr().err
    assert group.trials() == ["trial", "trial~1"]
    kept, new = group.trial("trial~1"), group.trial("trial")  # the same GroupReader: it sees the new folder
    assert _means(kept, "x") == pytest.approx({0: inputs[0].mean().item(), 1: inputs[1].mean().item()})
    assert [(k["timepoint"], k["value"]) for k in kept.kpis().to_pylist()] == [(0, 0.0), (1, 1.0)]
    assert _means(new, "x") == pytest.approx({0: inputs[3].mean().item()})
    assert not (Path(store_root) / "group" / ".replaced").exists()

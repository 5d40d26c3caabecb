"""What an unrecorded step does, with the recorder's short paths (issue 34): it still catches a NaN in every tensor the
sentinels watch, a name skipped as unwatched becomes watched when the rule changes (``set_sentinels``, an output that a
recorded step's graph shows), and it leaves nothing behind that the garbage collector tracks."""
from __future__ import annotations

import gc
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from comgra.store.reader import GroupReader  # noqa: E402

GROUP, TRIAL = "group", "trial"


def _step(recorder: Any, model: Any, step: int, *, poison: str | None = None) -> None:
    """One step of the tiny model, registering ``x`` (input), ``hidden``, ``y`` and ``loss``; ``poison`` names the
    tensor that holds a NaN on this step."""
    x = torch.randn(4, 3)
    recorder.start_batch(step, 4)
    recorder.start_iteration()
    recorder.register_tensor("x", x, is_input=True)
    hidden = model[1](model[0](x))
    if poison == "hidden":
        hidden = hidden * torch.tensor([1.0, math.nan, 1.0, 1.0])
    recorder.register_tensor("hidden", hidden)
    y = model[2](hidden)
    recorder.register_tensor("y", y)
    loss = y.pow(2).mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    loss.backward()
    recorder.record_current_gradients("gradients")
    recorder.finish_iteration()
    recorder.finish_batch()


def _rows(store_root: Path) -> list[dict[str, Any]]:
    return GroupReader(store_root / GROUP).trial(TRIAL).evidence("sentinels").to_pylist()


def test_a_name_skipped_as_unwatched_is_watched_after_set_sentinels(make_recorder, tiny_model, store_root) -> None:
    """``hidden`` is no sentinel by default: unrecorded steps skip it at once. Marked with set_sentinels, its NaN on an
    unrecorded step is caught on that step."""
    recorder = make_recorder(steps=set())
    for step in range(3):
        _step(recorder, tiny_model, step)
    assert "hidden" in recorder._unwatched  # the short path is in use
    recorder.set_sentinels(["hidden", "loss"])
    _step(recorder, tiny_model, 3, poison="hidden")
    _step(recorder, tiny_model, 4)
    recorder.finalize()
    rows = _rows(store_root)
    assert [(r["training_step"], r["event"]) for r in rows if r["name"] == "hidden"] == [(3, "nan"), (4, None)]
    assert not any(r["name"] == "hidden" for r in rows if r["training_step"] < 3)
    assert {r["recorded"] for r in rows} == {False}


def test_an_output_learned_on_a_recorded_step_is_watched_on_the_unrecorded_steps_after(
        make_recorder, tiny_model, store_root) -> None:
    """``y`` is skipped as unwatched before the first recorded step; that step's graph shows it as an output, and from
    then on its NaN is caught on an unrecorded step."""
    recorder = make_recorder(steps={2})
    for step in range(2):
        _step(recorder, tiny_model, step)
    assert "y" in recorder._unwatched
    _step(recorder, tiny_model, 2)  # recorded: learns the outputs
    recorder.flush()  # the graph is written (and its outputs learned) by now
    assert "y" not in recorder._unwatched
    poisoned = torch.nn.Sequential(tiny_model[0], tiny_model[1], torch.nn.Linear(4, 2))
    with torch.no_grad():
        poisoned[2].weight.fill_(math.nan)
    _step(recorder, poisoned, 3)
    recorder.finalize()
    rows = [r for r in _rows(store_root) if r["name"] == "y"]
    assert (3, "nan", False) in [(r["training_step"], r["event"], r["recorded"]) for r in rows]
    assert not any(r["training_step"] < 2 for r in rows)


def test_a_nan_input_or_loss_on_an_unrecorded_step_is_caught_on_that_step(make_recorder, tiny_model,
                                                                           store_root) -> None:
    recorder = make_recorder(steps=set())
    for step in range(3):
        _step(recorder, tiny_model, step)
    x = torch.tensor([[1.0, math.inf, 0.0]] * 4)
    recorder.start_batch(3, 4)
    recorder.start_iteration()
    recorder.register_tensor("x", x, is_input=True)
    loss = tiny_model(x).pow(2).mean() * math.nan  # (tanh saturates: the model alone gives a finite loss)
    recorder.register_tensor("loss", loss, is_loss=True)
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    events = {(r["training_step"], r["name"]): r["event"] for r in _rows(store_root)}
    assert (events[(3, "x")], events[(3, "loss")]) == ("inf", "nan")
    assert all(event is None for (step, _), event in events.items() if step < 3)


def test_a_stage_mistake_is_still_reported_on_an_unrecorded_step(make_recorder, tiny_model) -> None:
    """The short path is taken inside a step's forward pass only: a registration after finish_iteration is the
    user's mistake and raises as before, also for a name that the sentinels skip."""
    from comgra.errors import RecordingError

    recorder = make_recorder(steps=set())
    _step(recorder, tiny_model, 0)
    assert "hidden" in recorder._unwatched
    recorder.start_batch(1, 4)
    recorder.start_iteration()
    recorder.finish_iteration()
    with pytest.raises(RecordingError):
        recorder.register_tensor("hidden", torch.ones(4, 4))


def test_unrecorded_steps_leave_no_object_for_the_garbage_collector(make_recorder, tiny_model) -> None:
    """A row kept per step as a tuple until the table is handed on (2,048 rows) grew the collector's heap by three
    objects a step (1,200 in this test), and its full collections of the whole process then cost more than the
    sentinels: the rows are kept column by column, as numbers and strings, which it does not track. What the writer
    and the breakpoints' poll make now and then, apart from the steps, is a few dozen objects."""
    recorder = make_recorder(steps=set(), resource_seconds=None, flush_seconds=60.0)
    for step in range(20):  # warm-up: the first steps make what every step reuses
        _step(recorder, tiny_model, step)
    model = tiny_model
    x = torch.randn(4, 3)
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for step in range(20, 420):
            recorder.start_batch(step, 4)
            recorder.start_iteration()
            recorder.register_tensor("x", x, is_input=True)
            y = model(x)
            recorder.register_tensor("y", y)
            loss = y.pow(2).mean()
            recorder.register_tensor("loss", loss, is_loss=True)
            recorder.finish_iteration()
            recorder.finish_batch()
        recorder._evidence.sentinels.flush()  # the steps held (at most 16: sentinels.HOLD_STEPS) read and let go
        grown = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert grown < 200, f"{grown} objects the collector tracks were left by 400 unrecorded steps"

"""The recorder's own work on a recorded step runs no garbage collection (capture/step.py,
garbage_collector_paused): the graph walk, the summaries and the rows make about a thousand short-lived
objects per step, and a collection among them examined them for nothing and pushed the step's objects
into the older generations, which brought full collections of the whole process."""
from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from comgra import recorder as recorder_module  # noqa: E402
from comgra.capture.session import Session  # noqa: E402
from comgra.capture.step import garbage_collector_paused  # noqa: E402


@pytest.fixture
def low_threshold() -> Iterator[None]:
    """A youngest-generation threshold of 50 objects: the graph walk of a deep chain surely crosses it."""
    saved = gc.get_threshold()
    gc.collect()
    gc.set_threshold(50, saved[1], saved[2])
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def _collections_inside_the_recorders_calls(make_recorder: Any, record_step: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """Collections started inside the recorder's work at the end of an iteration and of the step (the graph
    walk, the rows: Session.finish_iteration and finish_step), and anywhere in the step, over 3 recorded
    steps of a chain of 150 unregistered ops between two registered tensors."""
    recorder = make_recorder(steps={0, 1, 2})
    weight = torch.nn.Parameter(torch.ones(4))
    recorder.track_module("chain", torch.nn.ParameterList([weight]))
    inside, anywhere, flag = [0], [0], [False]

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            anywhere[0] += 1
            inside[0] += flag[0]

    def flagged(name: str) -> None:
        original = getattr(Session, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            flag[0] = True
            try:
                return original(*args, **kwargs)
            finally:
                flag[0] = False
        monkeypatch.setattr(Session, name, call)
    for name in ("finish_iteration", "finish_step"):
        flagged(name)

    def forward(rec: Any) -> Any:
        x = torch.randn(2, 4)
        rec.register_tensor("x", x, is_input=True)
        for _ in range(150):
            x = x * weight + 1.0
        rec.register_tensor("out", x)
        loss = x.pow(2).mean()
        rec.register_tensor("loss", loss, is_loss=True)
        return loss
    gc.callbacks.append(count)
    try:
        for step in range(3):
            record_step(recorder, step, 2, forward)
    finally:
        gc.callbacks.remove(count)
    return inside[0], anywhere[0]


def test_the_recorders_own_work_runs_no_garbage_collection(make_recorder, record_step, low_threshold,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    inside, anywhere = _collections_inside_the_recorders_calls(make_recorder, record_step, monkeypatch)
    assert inside == 0
    assert anywhere > 0  # the threshold is low enough that the step's own code collects
    assert gc.isenabled()


def test_without_the_pause_the_same_calls_collect(make_recorder, record_step, low_threshold,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The positive control of the test above: the same steps collect inside those calls without it."""
    monkeypatch.setattr(recorder_module, "garbage_collector_paused", _not_paused)
    inside, _ = _collections_inside_the_recorders_calls(make_recorder, record_step, monkeypatch)
    assert inside > 0


class _not_paused:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: Any) -> None:
        return None


def test_the_collector_comes_back_after_an_error_and_stays_off_where_the_user_turned_it_off() -> None:
    with pytest.raises(ValueError):
        with garbage_collector_paused():
            assert not gc.isenabled()
            raise ValueError("inside")
    assert gc.isenabled()
    gc.disable()
    try:
        with garbage_collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()

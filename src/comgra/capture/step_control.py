"""Dropping a training step that an exception interrupted: ``ComgraRecorder.abandon_step`` and ``batch``.

In a notebook an exception inside a step (a shape mistake, a NaN check, Ctrl+C) leaves the recorder
inside the step, and the next ``start_batch`` refuses to run. ``abandon_step`` closes the step as if it
had not begun: nothing of it reaches the store (its tensors, its graph, its KPI points; notes are a log
and stay), its hooks and the tensors it held are let go, the recorder's step counter goes back to the
step before, and the recording policy never hears of it. ``batch`` is the context-manager form: it
abandons the step when its block raises and finishes it when the block ends.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from comgra.capture import open_recorders, stages
from comgra.errors import RecordingError


def opened(recorder: Any, training_step: int, type_of_execution: str | None) -> None:
    """At ``start_batch``, before the step's number is taken: the number and the type checked (``check_order``; a
    type once, not on every step), then what ``abandon`` goes back to remembered. One call: on an unrecorded step
    each call into comgra costs microseconds of cold caches (benchmarks/unrecorded_step.py)."""
    check_order(recorder, training_step, type_of_execution)  # a step is (number, type)
    if type_of_execution is not None and not (isinstance(type_of_execution, str)
                                              and type_of_execution in recorder._types_seen):
        stages.check_type(type_of_execution)
        recorder._types_seen.add(type_of_execution)
    if recorder.session is not None and recorder.session.closed:  # finalized: perhaps replaced by a new recorder
        open_recorders.check_not_replaced(recorder)
    recorder._step_before = recorder.training_step
    of_type = recorder.__dict__.setdefault("_last_step_of_type", {})
    recorder._type_step_before = (type_of_execution, of_type.get(type_of_execution))
    of_type[type_of_execution] = training_step
    recorder._kpis.start_step()


def check_order(recorder: Any, training_step: int, type_of_execution: str | None) -> None:
    """A step is (training_step, type_of_execution): the numbers never go back, and each type's increase strictly.
    So an evaluation may take the number of the training step that follows it (the Trainer's ``global_step``),
    and a step is never recorded twice. Raises before anything of the step is taken (``opened`` takes it)."""
    last = recorder.training_step
    of_type: dict[Any, int] = recorder.__dict__.setdefault("_last_step_of_type", {})
    same_type = of_type.get(type_of_execution)
    if last is not None and (training_step < last or (same_type is not None and training_step <= same_type)):
        previous = (f"the previous step was {last}" if training_step < last else
                    f"step {same_type} of type {type_of_execution!r} was recorded already")
        raise RecordingError(f"training_step={training_step} does not increase ({previous}); pass a step counter "
                             "that grows by at least 1 per call (a step of another type_of_execution may share the "
                             "number of a training step), or make a new ComgraRecorder to record from the start again.")


def decide(recorder: Any, step: int, type_of_execution: str | None, override: bool | None) -> bool:
    """At ``start_batch``: whether the recording policy (or ``override__recording_is_active``) records this step."""
    if recorder.session is None or recorder.session.broken:
        return False
    if override is not None:
        return bool(override)
    policy = recorder.decision_maker_for_recordings
    if type_of_execution is None:
        return not recorder._all_types_declared or any(policy.is_record_on_this_step(step, t)
                                                       for t in recorder._types_seen)
    return policy.is_record_on_this_step(step, type_of_execution)


def abandon(recorder: Any) -> bool:
    """Close the open step without storing any of it; False where no step is open."""
    if recorder.current_stage == "inactive":
        return False
    for listener in list(recorder._step_listeners):  # comgra.watch takes its hooks off
        listener(False)
    if recorder.session is not None:
        recorder.session.abandon_step()
    if recorder._breakpoints is not None:
        recorder._breakpoints.abandon_step()
    recorder.instruments.abandon_step()
    recorder._kpis.drop_step()
    recorder.current_stage = "inactive"
    recorder._recording = recorder._dynamic = False
    recorder.training_step = recorder._step_before
    type_of_execution, before = getattr(recorder, "_type_step_before", (None, None))
    of_type = recorder.__dict__.get("_last_step_of_type", {})
    if before is None:
        of_type.pop(type_of_execution, None)
    else:
        of_type[type_of_execution] = before
    recorder._end_eager_step()  # a compiled model runs compiled again (see comgra.capture.compiled)
    return True


@contextmanager
def batch(recorder: Any, start_batch_arguments: tuple[Any, ...]) -> Iterator[Any]:
    recorder.start_batch(*start_batch_arguments)
    try:
        yield recorder
    except BaseException:
        recorder.abandon_step()
        raise
    recorder.finish_batch()

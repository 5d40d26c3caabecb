"""The order of a training step's recording calls, and the names a type of step may have: the checks the
recorder makes of the documented API's use, each raising an error that says what was called when and how
to fix it."""
from __future__ import annotations

import re

from typing import Any

from comgra.capture.checkpointing import recomputing
from comgra.errors import ConfigError, RecordingError

TYPE_PATTERN = re.compile(r"^[a-zA-Z0-9\-_]+$")
STAGES_FOR = {
    "start_iteration": ("started", "after_iteration"),
    "finish_iteration": ("forward",),
    "finish_batch": ("started", "after_iteration"),
    "decide_recording_of_batch": ("started", "after_iteration"),
}


def check_stage(call: str, stage: str) -> None:
    """Raise where ``call`` comes at ``stage`` of the step, out of the documented order."""
    if stage not in STAGES_FOR[call]:
        raise RecordingError(f"{call}() was called {_stage_text(stage)}; the order is start_batch(), "
                             "then per iteration start_iteration() ... finish_iteration(), then finish_batch().")


def check_registration(tensor_name: str, stage: str, is_initial_value: bool) -> None:
    """Raise where ``register_tensor`` comes at ``stage``: an initial value before the first iteration, any
    other tensor inside one."""
    expected = ("started",) if is_initial_value else ("forward",)
    if stage not in expected:
        where = "between start_batch() and the first start_iteration()" if is_initial_value else \
            "between start_iteration() and finish_iteration()"
        raise RecordingError(f"register_tensor({tensor_name!r}) was called {_stage_text(stage)}; call it {where}.")


def check_gradient_group(name_of_loss_group: str) -> None:
    if name_of_loss_group == "forward" or not TYPE_PATTERN.match(str(name_of_loss_group)):
        raise RecordingError(f"name_of_loss_group={name_of_loss_group!r} is not usable; use letters, digits, "
                             "'-' and '_', and not 'forward' (the name of the values themselves), e.g. 'gradients'.")


def registration_goes_on(recorder: Any, tensor_name: str, tensor: Any, is_initial_value: bool, watched: bool,
                         is_loss: bool = False, is_input: bool = False) -> bool:
    """``check_registration`` for ``ComgraRecorder.register_tensor``, and whether it has more to do (a recorded or
    watched step). A checkpointed function's recomputation in the backward pass (capture/checkpointing.py) registers
    again what its forward pass registered: that goes to the step at any stage, and no further."""
    recording, stage = recorder._recording, recorder.current_stage  # (read once: called for every tensor of every step)
    if (stage != "forward" or watched or recording) and recomputing():
        if recording:
            recorder._guarded(lambda session: session.recomputed(tensor_name, tensor))
        return False
    if is_initial_value or stage != "forward":
        check_registration(tensor_name, stage, is_initial_value)
    recorder._evidence.register(tensor_name, tensor, is_loss, recording, is_input)  # sentinels, dtypes (capture.evidence)
    return bool(watched or recording)


def check_type(type_of_execution: str) -> None:
    if (not isinstance(type_of_execution, str) or not TYPE_PATTERN.match(type_of_execution)
            or type_of_execution == "any_value" or type_of_execution.startswith("__")):
        raise ConfigError(f"type_of_execution={type_of_execution!r} is not usable; use letters, digits, '-' and '_' "
                          "(not starting with '__', not 'any_value'), e.g. '05_iterations'.")


def check_decision(type_of_execution: str | None, started_as: str | None, *, dynamic: bool, all_declared: bool,
                   seen: set[str]) -> None:
    """Raise where ``decide_recording_of_batch(type_of_execution, ...)`` does not fit the step: a step started
    with a type of its own must name the same type; a type decided late must be a usable name, and a known
    one once all types were declared."""
    if not dynamic:
        if type_of_execution != started_as:
            raise RecordingError(f"decide_recording_of_batch({type_of_execution!r}) disagrees with start_batch("
                                 f"type_of_execution={started_as!r}); pass None to start_batch to decide late.")
        return
    if type_of_execution is not None:
        check_type(type_of_execution)
        if all_declared and type_of_execution not in seen:
            raise RecordingError(f"type_of_execution={type_of_execution!r} appeared after "
                                 "declare_that_all_different_types_of_execution_have_been_encountered(); "
                                 f"known types: {sorted(seen)}.")


def _stage_text(stage: str) -> str:
    return {
        "inactive": "outside a training step (before start_batch() or after finish_batch())",
        "started": "after start_batch() but before start_iteration()",
        "forward": "inside an iteration (after start_iteration(), before finish_iteration())",
        "after_iteration": "after finish_iteration() but before the next start_iteration() or finish_batch()",
    }[stage]

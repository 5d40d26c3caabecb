"""Driving a recorder from a training framework's events, shared by the Trainer and Lightning callbacks.

One comgra training step is one optimizer step: its micro-batches (gradient accumulation) are the
step's iterations, its parameter gradients are read once, after the last micro-batch. One evaluation
run is one comgra step of type ``"evaluation"``: its first batch (the rest of the run is not recorded).
With ``number_of`` (the framework's optimizer step counter: the Trainer's ``global_step``), a training step is
numbered by the counter as it stands when the step begins (0, 1, 2, ...), and an evaluation run by the counter
as it stands when it runs: after optimizer step g it is g, the number of the training step that follows, with
the type "evaluation" (a step is its number and its type). So a value the framework logs at ``global_step`` g
(``eval_loss``) belongs to comgra's step g. A second evaluation at the same counter is not recorded. Without
``number_of``, comgra counts both in the order they ran.

A fault of comgra's own in a callback is reported once, with a warning, and switches the callback
off; the training goes on.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from comgra.errors import ConfigError
from comgra.recorder import ComgraRecorder

TRAINING = "training"
EVALUATION = "evaluation"


class IntegrationWarning(UserWarning):
    """An integration could not record something (a callback stopped after a fault of comgra's own, a module
    output ``comgra.watch`` cannot look into); the training goes on."""


class StepDriver:
    """``start_batch`` ... ``finish_batch`` for one recorder, from the events of a training loop."""

    def __init__(self, recorder: ComgraRecorder, *, record_evaluation: bool = True,
                 number_of: Callable[[], int] | None = None):
        self.recorder = recorder
        self.number_of = number_of
        self.record_evaluation = record_evaluation
        self.enabled = recorder.comgra_is_active
        self.number = -1  # the last comgra step number handed out
        self._evaluated_at: int | None = None  # the number of the last evaluation step (with number_of)
        self._last_of: dict[str, int] = {}  # the last number of each kind of step
        self.open: str | None = None  # TRAINING or EVALUATION while a step is open
        self.evaluation_done = False  # this evaluation run's first batch is recorded
        self._loss_iteration = -1  # the recorder's iteration serial whose loss is registered
        self.gradients_recorded = False  # in the open step

    # -- training ------------------------------------------------------------------------------
    def training_batch(self, batch_size: int) -> None:
        """A micro-batch starts: the first opens the step, each later one is the next iteration."""
        if self.open == EVALUATION:
            self._finish()
        if self.open is None:
            self._start(TRAINING, batch_size)
        elif self.recorder.current_stage == "after_iteration":
            self.recorder.start_iteration()

    def end_micro_batch(self) -> None:
        """A micro-batch ended without an optimizer step (gradient accumulation)."""
        if self.open == TRAINING and self.recorder.current_stage == "forward":
            self.recorder.finish_iteration()

    def record_gradients(self, scaler: Any = None) -> None:
        """The parameters' gradients, accumulated over the micro-batches (once per step: the first call), and the
        activations' gradients; unscaled by ``scaler`` (the framework's GradScaler, None without one)."""
        if self.open == TRAINING and not self.gradients_recorded:
            self.gradients_recorded = True
            self.recorder.record_current_gradients("gradients", scaler=scaler)

    def gradients_and_finish(self, scaler: Any = None) -> None:
        """Before the optimizer step: the gradients (unless read already), and the step ends."""
        if self.open == TRAINING:
            self.record_gradients(scaler)
            self._finish()

    def finish_open_step(self) -> None:
        if self.open is not None:
            self._finish()

    # -- evaluation ----------------------------------------------------------------------------
    def evaluation_batch(self, batch_size: int) -> None:
        if self.record_evaluation and not self.evaluation_done and self.open is None:
            if self.number_of is not None:
                if self._evaluated_at is not None and self.number_of() <= self._evaluated_at:
                    return  # evaluated again at the same optimizer step: that step is recorded already
                self._evaluated_at = self.number_of()
            self._start(EVALUATION, batch_size)

    def end_evaluation_batch(self) -> None:
        if self.open == EVALUATION:
            self._finish()
            self.evaluation_done = True

    def end_evaluation_run(self) -> None:
        self.end_evaluation_batch()
        self.evaluation_done = False

    # -- both ----------------------------------------------------------------------------------
    def loss(self, loss: Any, scaler: Any = None) -> None:
        """Register the loss of the current iteration (once: the first one seen). ``scaler``: the GradScaler that
        scaled ``loss`` already; the loss is recorded divided by its scale (and without a gradient of its own)."""
        recorder = self.recorder
        if self.open is None or not isinstance(loss, torch.Tensor):
            return
        if not recorder._takes_watched_tensors():  # a step not recorded: the every-step sentinels still see the loss
            recorder._watched_sentinel("loss", loss, True)
            return
        if self._loss_iteration == recorder._iteration_serial:
            return
        self._loss_iteration = recorder._iteration_serial
        if scaler is not None and scaler.is_enabled():
            loss = loss / scaler.get_scale()
        if loss.grad_fn is None and not loss.requires_grad:
            loss = loss.detach()  # evaluation: recorded by value; the caller's tensor keeps requires_grad=False
        recorder._register_watched("loss", loss, None, is_loss=True)

    def next_number(self) -> int:
        """The number the next training step will take."""
        return self.number + 1 if self.number_of is None else self.number_of()

    def _start(self, kind: str, batch_size: int) -> None:
        number = self.next_number()
        last = self._last_of.get(kind)
        if last is not None and number <= last:  # an optimizer step the framework did not count: never a step twice
            number = last + 1
        self.number = self._last_of[kind] = max(number, self.number)
        self.open = kind
        self.gradients_recorded = False
        self.recorder.start_batch(self.number, batch_size, type_of_execution=kind)
        self.recorder.start_iteration()

    def _finish(self) -> None:
        self.open = None
        if self.recorder.current_stage == "forward":
            self.recorder.finish_iteration()
        if self.recorder.current_stage != "inactive":
            self.recorder.finish_batch()


class Guard:
    """Runs a callback's work; a fault of comgra's own is reported once and switches the callback off."""

    def __init__(self, where: str):
        self.where = where
        self.broken = False

    def run(self, action: Any, *arguments: Any) -> None:
        if self.broken:
            return
        try:
            action(*arguments)
        except Exception as error:  # noqa: BLE001 - the training must go on
            self.broken = True
            warnings.warn(f"comgra's {self.where} stopped recording after an internal error: "
                          f"{type(error).__name__}: {error}. Training goes on.", IntegrationWarning, stacklevel=2)


def batch_size_of(args: Any, kwargs: Any = None) -> int:
    """The size of the first dimension of the first tensor in a batch (tensors, tuples, lists, dicts)."""
    for value in (kwargs or {}).values():
        found = _first_tensor(value, 0)
        if found is not None:
            return found
    found = _first_tensor(args, 0)
    return 1 if found is None else found


def _first_tensor(value: Any, depth: int) -> int | None:
    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() > 0 else None
    if depth > 3:
        return None
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (tuple, list)) else ()
    for item in items:
        found = _first_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def loss_of(output: Any) -> Any:
    """The loss in a model's or a step's output: the tensor itself, ``output["loss"]`` or ``output.loss``."""
    if isinstance(output, torch.Tensor):
        return output if output.dim() == 0 else None
    if isinstance(output, Mapping):
        return output.get("loss")
    return getattr(output, "loss", None)


def check_recorder_arguments(recorder: Any, given: dict[str, Any]) -> None:
    """A callback takes either a recorder or the arguments to make one, not both."""
    named = sorted(name for name, value in given.items() if value is not None)
    if recorder is not None and named:
        raise ConfigError(f"Pass either recorder=... or the arguments to make one ({', '.join(named)}), not both.")
    if recorder is not None and not isinstance(recorder, ComgraRecorder):
        raise ConfigError(f"recorder={recorder!r} is not a ComgraRecorder; pass one, or leave it out and pass "
                          "comgra_root_path=... to let the callback make it.")


def callback_options(recorder: Any, watch: object, *, given: dict[str, Any], default_group: str,
                     example: str) -> tuple[tuple[Any, ...], dict[str, Any] | None]:
    """The checked arguments of a callback: (the recorder's arguments with the defaults filled in, the
    ``comgra.watch`` options or None for parameters only). ``given``: comgra_root_path, group, trial_id,
    decision_maker_for_recordings and the other recorder options; ``example``: an include pattern for the
    error message."""
    check_recorder_arguments(recorder, given)
    if not isinstance(watch, (bool, Mapping)):
        raise ConfigError(f"watch={watch!r} must be True, False or a dict of comgra.watch options, "
                          f"e.g. {{'include': {example!r}}}.")
    options = dict(given)
    arguments = (options.pop("comgra_root_path"), options.pop("group") or default_group,
                 options.pop("trial_id") or "trial", options.pop("decision_maker_for_recordings"), options)
    return arguments, dict(watch) if isinstance(watch, Mapping) else ({} if watch else None)

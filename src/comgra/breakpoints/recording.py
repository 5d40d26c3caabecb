"""The recorder's side of breakpoints: check on every step, and record in full the step where one holds.

A step that the policy does not record touches no tensor. While breakpoints are enabled, such a
step keeps a *shadow*: the list of recording calls made so far (a tuple append each, tensors by
reference). When a condition holds mid-step, the shadow is replayed into a fresh step recording and
the rest of the step is recorded as usual, so the paused step is in the store in full.

Under torch.distributed, another rank's hit is known only when the ranks agree, at finish_batch
before the step's recording is finished (``settle``): a rank that did not record replays its whole
shadow then. So that this replay is a full recording, the shadow of a distributed run also keeps what
the backward pass would otherwise throw away (``[breakpoints] record_every_rank``, on by default):
each registered tensor's gradient (one tensor hook each), and inputs switched to requires_grad as
on a recorded step, so that they have gradients and edges; both are undone at finish_batch.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import torch

from comgra.config import Settings, load_settings
from comgra.errors import ComgraError, TrainingAborted
from comgra.breakpoints import control
from comgra.breakpoints.monitor import BreakpointMonitor
from comgra.store import format as fmt

__all__ = ["RecorderBreakpoints"]


class Recorder(Protocol):
    """What the breakpoints use of the recorder that attaches them (``ComgraRecorder``; this package never
    imports it: the recorder wires the breakpoints, not the other way round)."""

    options: Any  # capture.options.RecorderOptions
    rank_info: Any  # capture.ranks.RankInfo
    session: Any  # capture.session.RecordingSession, None when comgra is off
    modules: Any
    training_step: int | None
    type_of_execution: str | None
    _kpis: Any  # the KPI points waiting for a flush: written before a pause
    _recording: bool

    def recording_is_active(self) -> bool: ...

    def _guarded(self, action: Any) -> None: ...  # runs ``action(session)``; a fault of comgra's own stops recording


class RecorderBreakpoints:
    """Created by ComgraRecorder when it records; ``None`` there when comgra is off (nothing to pay)."""

    def __init__(self, recorder: Recorder, monitor: BreakpointMonitor):
        self.recorder = recorder
        self.monitor = monitor
        self.shadow: list[tuple[Any, ...]] | None = None
        self.forced = False
        # A distributed run: keep gradients in the shadow, so that a peer's hit can be recorded here in full.
        self.full_shadow = monitor.world_size > 1 and monitor.settings.record_every_rank
        self._switched_on_grad: list[torch.Tensor] = []
        self._gradient_hooks: list[Any] = []  # removed at finish_batch: a reused input must not collect them
        self._step_args: tuple[int, bool] = (0, True)
        monitor.on_hit = self.force_recording

    @classmethod
    def attach(cls, recorder: Recorder, *, breakpoints: Iterable[dict[str, Any]] | None,
               settings: Settings) -> RecorderBreakpoints | None:
        options, ranks = recorder.options, recorder.rank_info
        if ranks.world_size > 1 and options.record_ranks is not None and \
                not set(range(ranks.world_size)) <= options.record_ranks:
            if breakpoints or settings.breakpoints.set:
                warnings.warn("comgra breakpoints need every rank of a torch.distributed run to record "
                              "(record_ranks='all'); they are off for this run.", stacklevel=3)
            return None
        initial = [control.checked_breakpoint(entry) for entry in
                   list(settings.breakpoints.set) + list(breakpoints or [])]  # the user's mistakes raise here
        session = recorder.session
        if ranks.world_size == 1 and (session is None or session.broken):
            return None  # recording is off after a fault of comgra's own (already reported): so are breakpoints
        warn = session.warn_once if session is not None else _warn_once()
        try:
            monitor = BreakpointMonitor(
                fmt.trial_dir(options.group_dir, options.trial_id), settings.breakpoints, rank=ranks.rank,
                world_size=ranks.world_size, initial=initial if (initial or breakpoints is not None) else None,
                warn=warn)
        except (OSError, ComgraError) as error:  # a fault of comgra's own never stops the training
            warn("bp-start", f"comgra breakpoints are off: {error}. Training goes on.")
            return None
        return cls(recorder, monitor)

    # -- calls from the recorder ---------------------------------------------------------------------
    def start_batch(self, recording: bool, training_step: int, batch_size: int, per_sample: bool) -> bool:
        """Returns whether the step is recorded: as the policy says, or forced by a pending "step"."""
        self.forced = self.monitor.start_batch(training_step, self.recorder.type_of_execution)
        session = self.recorder.session
        healthy = session is not None and not session.broken
        if self.forced and not recording and healthy:
            recording = session.start_step(training_step, batch_size, self.recorder.type_of_execution,  # type: ignore[union-attr]
                                           self.recorder.modules, per_sample)
        self._step_args = (batch_size, per_sample)
        self.shadow = [] if self.monitor.active and not recording and healthy else None
        return recording

    def start_iteration(self) -> None:
        if self.monitor.active:
            self.monitor.step.iteration += 1
            self.keep(("start_iteration",))

    def register(self, name: str, tensor: torch.Tensor, arguments: dict[str, Any]) -> None:
        if self.monitor.active:
            if self.monitor.check_tensor(name, tensor):
                self.force_recording()
            if self.shadow is not None:  # (None once this step records: force_recording drops it)
                self.shadow.append(("register", name, tensor, arguments, self._keep_gradient(tensor))
                                   if self.full_shadow else ("register", name, tensor, arguments))

    def _keep_gradient(self, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        """A box that receives ``tensor``'s gradient in the backward pass (what a recorded step's hook sees)."""
        box: dict[str, torch.Tensor] = {}
        if tensor.is_floating_point() and not tensor.requires_grad and tensor.grad_fn is None:
            tensor.requires_grad_(True)  # as a recorded step does for an input; undone at finish_batch
            self._switched_on_grad.append(tensor)
        if tensor.requires_grad:
            def keep(grad: torch.Tensor) -> None:
                box["grad"] = grad.detach() if "grad" not in box else box["grad"] + grad.detach()
            self._gradient_hooks.append(tensor.register_hook(keep))
        return box

    def gradients(self, name_of_loss_group: str, set_to_zero: bool, scale: Any = None) -> None:
        """``scale``: the call's loss scale (capture.gradients.GradientScale), for the replay."""
        if self.monitor.active:
            if self.monitor.check_gradients():
                self.force_recording()
            self.keep(("gradients", name_of_loss_group, set_to_zero) + (() if scale is None else (scale,)))

    def keep(self, call: tuple[Any, ...]) -> None:
        """Remember a recording call of an unrecorded step, in case a breakpoint forces its recording.

        The shadow exists only on a step that does not record (start_batch), until it does."""
        if self.shadow is not None:
            self.shadow.append(call)

    def settle(self) -> None:
        """At finish_batch, before the step's recording is finished: when the step pauses (its hit may
        be another rank's), record it here too, replaying the calls made so far."""
        try:
            if self.monitor.settle() and not self.recorder.recording_is_active():
                self.force_recording()
        except (TrainingAborted, KeyboardInterrupt):
            raise
        except Exception as error:  # noqa: BLE001 - a fault of comgra's own never stops the training
            self._fault(error)

    def finish_batch(self) -> None:
        self._let_go_of_step()
        try:
            self.monitor.finish_batch(flush=self._flush)
        except (TrainingAborted, KeyboardInterrupt):
            raise
        except Exception as error:  # noqa: BLE001 - a fault of comgra's own never stops the training
            self._fault(error)

    def abandon_step(self) -> None:
        """The step was abandoned (``ComgraRecorder.abandon_step``): no check of it settles or pauses. Under
        torch.distributed every rank must abandon the same step, as no rank then settles it with the others."""
        self._let_go_of_step()
        self.forced = False
        self.monitor.abandon_step()

    def _let_go_of_step(self) -> None:
        self.shadow = None
        for tensor in self._switched_on_grad:  # leave the user's tensors as they were before the step
            tensor.requires_grad_(False)
            tensor.grad = None
        self._switched_on_grad.clear()
        for handle in self._gradient_hooks:
            handle.remove()
        self._gradient_hooks.clear()

    def _fault(self, error: Exception) -> None:
        self.monitor.switch_off(f"an internal error: {type(error).__name__}: {error}")

    def _flush(self) -> None:
        """Before pausing: the step and its KPIs must be readable in the store while the run waits."""
        session = self.recorder.session
        if session is not None and session.writer is not None and not session.broken:
            session.flush_kpis(self.recorder._kpis, force=True)
            session.writer.flush()

    def close(self) -> None:
        self.monitor.close()

    # -- forcing the recording of this step ------------------------------------------------------------
    def force_recording(self) -> None:
        """Record the current step from now on, replaying the calls made so far in it."""
        recorder, session, shadow = self.recorder, self.recorder.session, self.shadow
        self.forced = True
        if recorder.recording_is_active() or shadow is None or session is None or session.broken:
            return
        self.shadow = None
        batch_size, per_sample = self._step_args
        recorder._recording = session.start_step(recorder.training_step, batch_size,  # type: ignore[arg-type]
                                                 recorder.type_of_execution, recorder.modules, per_sample)
        if session.step is not None:
            session.step.replayed = True  # type: ignore[attr-defined]
        for call in shadow:
            recorder._guarded(lambda s, call=call: _replay(s, call))


def _replay(session: Any, call: tuple[Any, ...]) -> None:
    kind = call[0]
    if kind == "start_iteration":
        session.step.start_iteration()
    elif kind == "register":
        session.register(call[1], call[2], **call[3])
        grad = call[4].get("grad") if len(call) > 4 else None
        if grad is not None:  # the backward pass ran before this replay: give the step the gradient we kept
            session.step.add_gradient(call[1], grad)
    elif kind == "finish_iteration":
        session.finish_iteration()
    elif kind == "gradients":
        session.step.record_gradients(*call[1:])
    elif kind == "connect":
        session.step.connect(call[1], call[2])


def _warn_once() -> Any:
    seen: set[str] = set()

    def warn(key: str, message: str) -> None:
        if key not in seen:
            seen.add(key)
            warnings.warn(message, stacklevel=3)
    return warn


def load_recorder_settings(config: str | Path | None) -> Settings:
    return load_settings(config)

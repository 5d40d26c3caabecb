"""Breakpoints in the training process: check conditions on every step, pause, obey continue/step/abort.

The recorder calls a ``BreakpointMonitor`` at a few points of each training step. With no enabled
breakpoint every call returns after a flag check; with breakpoints, a target's metrics are a few
reductions of the tensors it names, moved to the host in one transfer. When a condition holds, the
recorder records the step in full and the process pauses at ``finish_batch``, blocked on a socket
(``control.wait_for_command``) until the app or the REST API sends a command.

Under torch.distributed the ranks agree on the breakpoints (every ``sync_every_steps`` steps rank 0
broadcasts the file if it changed), combine their hit flags with one all_reduce per step while
breakpoints exist (``settle``, before the step's recording is finished, so that every rank can record
the paused step), and pause and resume together: rank 0 waits for the command and broadcasts it.
They do so only in a run that starts with breakpoints (the recorder's argument or ``comgra.toml``,
the same on every rank) or with ``[breakpoints] sync_without_breakpoints = true``: a run without
them gets no collective of comgra's at all. The collectives run on a gloo group of comgra's own (so
that they never pair with the user's), carry JSON, not pickles, and wait at most
``collective_timeout_s`` (a pause: as long as it lasts); one that fails switches breakpoints off on
that rank, and the other ranks' next one times out and does the same. Training goes on.
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from comgra.config import BreakpointSettings
from comgra.errors import ComgraError, TrainingAborted, did_you_mean
from comgra.breakpoints import control
from comgra.breakpoints.conditions import Condition, parse_condition
from comgra.breakpoints.metrics import MetricPlan, tensor_metrics, tensor_metrics_of_many

__all__ = ["BreakpointMonitor", "tensor_metrics"]


@dataclass
class ActiveBreakpoint:
    id: str
    target: str
    condition: Condition
    needs_gradients: bool  # checked after backward, with the value metrics taken at registration


@dataclass
class StepState:
    """What the monitor knows about the current training step (a field added here is reset in ``start_batch``)."""

    training_step: int = -1
    type_of_execution: str | None = None
    iteration: int = -1  # as the recording's: 0 in the first iteration
    hit: ActiveBreakpoint | None = None  # the first breakpoint that held in this step
    held: set[str] = field(default_factory=set)  # ids that held in this step (a hit counts once per step)
    grad_tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # targets whose gradients are checked
    values: dict[str, dict[str, float]] = field(default_factory=dict)  # target -> its value metrics this step
    gradients_checked: bool = False
    settled: bool = False  # the ranks agreed on this step's hit (settle())
    pausing: bool = False
    module_started: dict[str, float] = field(default_factory=dict)
    module_seconds: dict[str, float] = field(default_factory=dict)


class BreakpointMonitor:
    """Owns the breakpoints of one recorder and the pause protocol of its process."""

    def __init__(self, trial_dir: Path, settings: BreakpointSettings, *, rank: int, world_size: int,
                 initial: list[dict[str, Any]] | None, warn: Callable[[str, str], None]):
        self.trial_dir = trial_dir
        self.settings = settings
        self.rank, self.world_size = rank, world_size
        self.lead = rank == 0
        self.warn = warn
        self.breakpoints: list[ActiveBreakpoint] = []
        self.by_target: dict[str, list[ActiveBreakpoint]] = {}
        # Per target, built once at load: the reductions its conditions read (values, and gradients).
        self.value_plans: dict[str, MetricPlan] = {}
        self.gradient_plans: dict[str, MetricPlan] = {}
        self.gradient_targets: set[str] = set()  # targets with a condition on their gradient
        self.active = False  # any enabled breakpoint, or a pending "step"
        self.stepping = False
        self.hits: dict[str, int] = {}
        self.step = StepState()
        self.modules: dict[str, torch.nn.Module] = {}
        self._hook_handles: list[Any] = []
        self._signature: tuple[int, int] | None = None
        self._next_poll = 0.0
        self._steps_seen = 0
        self._names_seen: set[str] = set()
        self._checked_targets = False
        self._end_reason: str | None = None
        # Decided from what every rank has alike (arguments, comgra.toml): whether the ranks share breakpoints.
        self.shared = world_size > 1 and (bool(initial) or settings.sync_without_breakpoints)
        self._group: Any = None  # comgra's own gloo group, made at the first shared step
        self._notice: str | None = None
        self._publish_failed: BaseException | None = None  # a write on the run-state thread that failed
        entries: list[dict[str, Any]] = []  # the other ranks get rank 0's at step 1
        if self.lead:
            if initial is not None:  # (the first poll reads the file again: an edit made meanwhile is not lost)
                entries = control.replace_breakpoints(trial_dir, initial)
            else:
                if world_size == 1:  # read now, not again at the first poll (ranks: rank 0 shares it at step 1)
                    self._signature = control.breakpoints_signature(trial_dir)
                entries = self._read()
            if world_size > 1 and not self.shared:
                self._unshared(entries)
                entries = []
            self._publish("running")
        self._load(entries)

    # -- the training step ----------------------------------------------------------------------
    def start_batch(self, training_step: int, type_of_execution: str | None) -> bool:
        """Refresh the breakpoints if due; True when this step must be recorded (a pending "step")."""
        step = self.step
        # The last step's state, where nothing was put in it, is used again: a new one costs 7 us in a training step
        # (cold caches), this 3.5 (benchmarks/unrecorded_step.py).
        if step.hit is None and not (step.held or step.values or step.grad_tensors or step.module_started
                                     or step.module_seconds):
            step.training_step, step.type_of_execution = training_step, type_of_execution
            step.iteration, step.gradients_checked, step.settled, step.pausing = -1, False, False, False
        else:
            self.step = StepState(training_step, type_of_execution)
        self._steps_seen += 1
        if self.world_size > 1 and self._distributed():  # (the size first: no call on one process)
            if not self.shared:
                if self.lead:
                    entries = self._read_if_lead()
                    if entries is not None:
                        self._unshared(entries)
            elif (self._steps_seen - 1) % max(1, self.settings.sync_every_steps) == 0:
                entries = self._collective(self._broadcast, self._read_if_lead())
                if entries is not None:  # None: rank 0 saw no change of breakpoints.json (or the broadcast failed)
                    self._load(entries)
        elif time.monotonic() >= self._next_poll:
            self._poll()
        return self.stepping

    def start_iteration(self, iteration: int) -> None:
        self.step.iteration = iteration

    def check_tensor(self, name: str, tensor: torch.Tensor) -> bool:
        """At register_tensor: check the value conditions on ``name``; True when one holds now."""
        if not self._checked_targets:  # the names are needed only until the targets were checked once
            self._names_seen.add(name)
        watching = self.by_target.get(name)
        if not watching:
            return False
        if name in self.gradient_targets and tensor.requires_grad:
            if tensor.grad_fn is not None:
                tensor.retain_grad()  # so that its gradient exists for the check after backward
            self.step.grad_tensors[name] = tensor
        values = self.step.values[name] = self.value_plans[name](tensor)
        return self._check(watching, values, gradients=False)

    def check_gradients(self) -> bool:
        """After backward (record_current_gradients or finish_batch): the gradient conditions."""
        held = False
        self.step.gradients_checked = True
        for target, plan in self.gradient_plans.items():
            gradients = self._gradients_of(target)
            if gradients is None:
                continue
            values = {f"grad_{k}": v for k, v in tensor_metrics_of_many(gradients, plan).items()}
            values.update(self.step.values.get(target, {}))
            if target in self.step.module_seconds:
                values["execution_time"] = self.step.module_seconds[target]
            held |= self._check(self.by_target[target], values, gradients=True)
        return held

    def settle(self) -> bool:
        """Before the step's recording is finished: the last checks, the ranks' agreement, the hit count.

        True when this step pauses (a breakpoint held on this rank or, under torch.distributed, on any
        rank; or a "step" was asked), so that every rank can still record it in full.
        """
        if self.step.settled:
            return self.step.pausing
        self.step.settled = True
        if self.by_target:
            if not self.step.gradients_checked:
                self.check_gradients()
            self._warn_unknown_targets()
        hit = self.step.hit
        if self.world_size > 1 and self._distributed() and self.shared and (self.breakpoints or self.stepping):
            hit = self.step.hit = self._collective(self._agree_on_hit)
        elif hit is not None:
            self.hits[hit.id] = self.hits.get(hit.id, 0) + 1
        self.step.pausing = hit is not None or self.stepping
        return self.step.pausing

    def finish_batch(self, flush: Callable[[], None]) -> str | None:
        """Pause if the step settled on a hit (or a "step" was asked); returns the action obeyed."""
        if not self.settle():
            return None
        hit = self.step.hit
        flush()  # the paused step must be readable in the store while we wait
        action = self._pause(hit)
        self.stepping = action == "step"
        self.active = bool(self.breakpoints) or self.stepping
        if action == "abort":
            self._end_reason = "aborted"
            self._publish("finished", reason="aborted")
            raise TrainingAborted(f"Training was aborted from comgra at step {self.step.training_step}"
                                  + (f" (breakpoint {hit.id}: {hit.target} {hit.condition.text!r})." if hit else "."))
        return action

    def abandon_step(self) -> None:
        """Forget the step in progress: what its checks found never settles, pauses or counts as a hit."""
        self.step = StepState()

    def close(self) -> None:
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles.clear()
        if self.lead:
            self._publish("finished", reason=self._end_reason)

    # -- modules ---------------------------------------------------------------------------------
    def add_modules(self, name: str, module: torch.nn.Module) -> None:
        for sub_name, sub in module.named_modules():
            self.modules.setdefault(f"{name}.{sub_name}" if sub_name else name, sub)
        self._hook_modules()

    def _hook_modules(self) -> None:
        """Forward hooks only on modules that an enabled breakpoint names; removed when none does."""
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles.clear()
        for target in self.by_target:
            module = self.modules.get(target)
            if module is not None:
                self._hook_handles.append(module.register_forward_pre_hook(self._before_module(target)))
                self._hook_handles.append(module.register_forward_hook(self._after_module(target)))

    def _before_module(self, target: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, inputs: Any) -> None:
            self.step.module_started[target] = time.perf_counter()
        return hook

    def _after_module(self, target: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            started = self.step.module_started.pop(target, None)
            seconds = time.perf_counter() - started if started is not None else float("nan")
            self.step.module_seconds[target] = seconds
            self._names_seen.add(target)
            watching = self.by_target.get(target, [])
            if not watching:
                return
            tensor = _first_tensor(output)
            values = self.value_plans[target](tensor) if tensor is not None else {}
            self.step.values[target] = values
            if self._check(watching, {**values, "execution_time": seconds}, gradients=False) and self.on_hit is not None:
                self.on_hit()
        return hook

    on_hit: Callable[[], None] | None = None  # the recorder's "record this step from now on"

    def _gradients_of(self, target: str) -> list[torch.Tensor] | None:
        tensor = self.step.grad_tensors.get(target)
        if tensor is not None:
            return [tensor.grad] if tensor.grad is not None else None
        module = self.modules.get(target)
        if module is None:
            return None
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        return grads or None

    # -- checking --------------------------------------------------------------------------------
    def _check(self, watching: list[ActiveBreakpoint], metrics: dict[str, float], *, gradients: bool) -> bool:
        values = metrics  # a fresh dict of this check: add the context metrics in place
        values["step"], values["iteration"] = self.step.training_step, self.step.iteration
        held_now = False
        for breakpoint in watching:
            if breakpoint.needs_gradients != gradients or breakpoint.id in self.step.held:
                continue
            try:
                holds = breakpoint.condition.evaluate(values)
            except KeyError as missing:
                self.warn(f"bp-metric:{breakpoint.id}", f"comgra breakpoint {breakpoint.id} ({breakpoint.target!r}) "
                          f"uses {missing}, which target {breakpoint.target!r} does not have; it never holds.")
                continue
            if holds:
                self.step.held.add(breakpoint.id)
                self.step.hit = self.step.hit or breakpoint
                held_now = True
        return held_now

    # -- loading the breakpoints ------------------------------------------------------------------
    def _poll(self) -> None:
        self._next_poll = time.monotonic() + self.settings.poll_interval_s
        signature = control.breakpoints_signature(self.trial_dir)
        if signature != self._signature:
            self._signature = signature
            self._load(self._read())
        if self.lead:
            self._publish("running", later=True)

    def _read_if_lead(self) -> list[dict[str, Any]] | None:
        """Rank 0: the breakpoints if the file changed since the last read (else None); the others: None."""
        if not self.lead:
            return None
        if time.monotonic() >= self._next_poll:  # "running" with a fresh time stamp, as often as without ranks
            self._next_poll = time.monotonic() + self.settings.poll_interval_s
            self._publish("running", later=True)
        signature = control.breakpoints_signature(self.trial_dir)
        if signature == self._signature:
            return None
        self._signature = signature
        return self._read()

    def _read(self) -> list[dict[str, Any]]:
        """The breakpoints file, checked entry by entry; unreadable or damaged, it keeps the breakpoints as they
        were (and says so once): a hand-edited file never stops the training."""
        try:
            return control.read_breakpoints(self.trial_dir)
        except (OSError, ComgraError) as error:
            # Each distinct damage says so once (the first one's warning must not silence a later, other one).
            self.warn(f"bp-read:{str(error)[:300]}", f"comgra keeps its breakpoints as they were "
                                                     f"({len(self.breakpoints)} enabled): {error}")
            return [{"id": b.id, "target": b.target, "condition": b.condition.text} for b in self.breakpoints]

    def _load(self, entries: list[dict[str, Any]]) -> None:
        loaded = []
        for entry in entries:  # checked by control.read_breakpoints; a peer's broadcast is checked again here
            if not isinstance(entry, dict) or not entry.get("enabled", True):
                continue
            try:
                checked = control.checked_breakpoint({k: v for k, v in entry.items() if k != "id"})
                condition = parse_condition(checked["condition"])
            except Exception as error:  # noqa: BLE001 - a bad file must not stop the training
                self.warn(f"bp-bad:{str(entry.get('id'))[:40]}",
                          f"comgra ignores breakpoint {str(entry.get('id'))[:40]!r}: {error}")
                continue
            loaded.append(ActiveBreakpoint(str(entry.get("id")), checked["target"], condition,
                                           bool(condition.gradient_metrics)))
        self.breakpoints = loaded
        self.by_target = {}
        for breakpoint in loaded:
            self.by_target.setdefault(breakpoint.target, []).append(breakpoint)
        self.value_plans = {target: MetricPlan(_value_metrics(watching)) for target, watching in self.by_target.items()}
        self.gradient_plans = {target: MetricPlan(_gradient_metrics(watching)) for target, watching in self.by_target.items()
                               if any(b.needs_gradients for b in watching)}
        self.gradient_targets = {b.target for b in loaded if b.needs_gradients}
        self.active = bool(loaded) or self.stepping
        self._checked_targets = False
        if self.modules:
            self._hook_modules()

    def _warn_unknown_targets(self) -> None:
        if self._checked_targets or not self._names_seen:
            return
        self._checked_targets = True
        known = self._names_seen | set(self.modules)
        for target in self.by_target:
            if target not in known:
                self.warn(f"bp-target:{target}", f"comgra breakpoint target {target!r} is neither a registered tensor "
                          f"nor a tracked module seen so far{did_you_mean(target, known)}")

    # -- pausing -----------------------------------------------------------------------------------
    def _pause(self, hit: ActiveBreakpoint | None) -> str:
        if self.lead:
            state = self._state("paused", breakpoint=hit.id if hit else None, reason="breakpoint" if hit else "step",
                                condition=hit.condition.text if hit else None, target=hit.target if hit else None)
            action = control.wait_for_command(self.trial_dir, state, self.settings.pause_timeout)
        else:
            action = "continue"
        if self._distributed():
            agreed = self._collective(self._broadcast, (action, self._read() if self.lead else None), pause=True)
            # The broadcast failed (breakpoints are off now): rank 0 still obeys its command, the others go on.
            action, entries = agreed if agreed is not None else (action, [])
            if self.shared:
                self._load(entries)
        else:
            self._signature = None  # the breakpoints may have changed while we waited
            self._poll()
        if self.lead:
            self._publish("running")
        return action

    def _agree_on_hit(self, *, timeout: datetime.timedelta) -> ActiveBreakpoint | None:
        """One all_reduce: which breakpoints held on any rank, and whether any rank asks to pause."""
        flags = torch.zeros(len(self.breakpoints) + 1)
        for index, breakpoint in enumerate(self.breakpoints):
            flags[index] = float(breakpoint.id in self.step.held)
        flags[-1] = float(self.stepping)
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX, group=self._comgra_group(),
                                     async_op=True).wait(timeout=timeout)
        hit = None
        for index, breakpoint in enumerate(self.breakpoints):
            if flags[index] > 0:
                self.hits[breakpoint.id] = self.hits.get(breakpoint.id, 0) + 1
                hit = hit or breakpoint
        return hit

    def _distributed(self) -> bool:
        return self.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()

    def _broadcast(self, payload: Any, *, timeout: datetime.timedelta) -> Any:
        """Rank 0's ``payload`` on every rank, as JSON (nothing from the wire is unpickled): its length, then its bytes."""
        group = self._comgra_group()
        data = json.dumps(payload).encode() if self.lead else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        torch.distributed.broadcast(size, src=0, group=group, async_op=True).wait(timeout=timeout)
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if self.lead else \
            torch.empty(int(size.item()), dtype=torch.uint8)
        torch.distributed.broadcast(buffer, src=0, group=group, async_op=True).wait(timeout=timeout)
        return payload if self.lead else json.loads(buffer.numpy().tobytes())

    def _comgra_group(self) -> Any:
        """A gloo group of comgra's own: its collectives never pair with the user's, whatever the backend."""
        if self._group is None:
            self._group = torch.distributed.new_group(backend="gloo", timeout=datetime.timedelta(days=7))
        return self._group

    def _collective(self, operation: Callable[..., Any], *arguments: Any, pause: bool = False) -> Any:
        """Run one of comgra's collectives; when it fails (a transfer fault, a peer that stopped taking part:
        ``collective_timeout_s``), breakpoints are off on this rank for the rest of the run, and None."""
        if not self.shared:
            return None
        timeout = datetime.timedelta(days=7) if pause else \
            datetime.timedelta(seconds=max(0.001, self.settings.collective_timeout_s))
        try:
            return operation(*arguments, timeout=timeout)
        except Exception as error:  # noqa: BLE001 - comgra's own fault: breakpoints stop, the training never
            self.switch_off(f"their collective across ranks failed ({type(error).__name__}: {str(error)[:200]})")
            return None

    def switch_off(self, reason: str) -> None:
        """No breakpoint and no collective of comgra's on this rank from now on; said once. Training goes on."""
        self.shared = False
        self.stepping = self.active = False
        self._load([])
        self._notice = f"comgra breakpoints are off for the rest of this run: {reason}. Training goes on."
        self.warn("bp-off", f"{self._notice} (rank {self.rank})")
        if self.lead:
            self._publish("running")

    def _unshared(self, entries: list[dict[str, Any]]) -> None:
        """A torch.distributed run that started without breakpoints: comgra checks none (that would take a
        collective); rank 0 says so once when breakpoints.json has enabled ones."""
        if not any(entry.get("enabled", True) for entry in entries):
            return
        self._notice = ("comgra does not check breakpoints in this torch.distributed run: it started without "
                        "breakpoints, and comgra adds no collective to such a run. Start it with breakpoints "
                        "(the recorder's breakpoints= or comgra.toml) or with [breakpoints] "
                        "sync_without_breakpoints = true.")
        self.warn("bp-unshared", self._notice)
        self._publish("running")

    def _state(self, state: str, **extra: Any) -> dict[str, Any]:
        return {"state": state, "training_step": self.step.training_step if self.step.training_step >= 0 else None,
                "type_of_execution": self.step.type_of_execution, "iteration": self.step.iteration,
                "breakpoint": None, "hits": dict(self.hits), "ranks": self.world_size, "pid": os.getpid(),
                "hostname": socket.gethostname(), "notice": self._notice, **extra}

    def _publish(self, state: str, *, later: bool = False, **extra: Any) -> None:
        """``later``: written on comgra's run-state thread (the periodic "running"; see control.write_run_state)."""
        failed, self._publish_failed = self._publish_failed, None
        if failed is not None:
            self._publish_fault(failed)
        try:
            control.write_run_state(self.trial_dir, self._state(state, **extra),
                                    on_error=self._note_publish_failure if later else None)
        except (OSError, ComgraError) as error:
            self._publish_fault(error)

    def _note_publish_failure(self, error: BaseException) -> None:  # on the run-state thread: said at the next publish
        self._publish_failed = error

    def _publish_fault(self, error: BaseException) -> None:
        """A full disk, a live/ that is a link (or anything on the run-state thread): said, never the training's end."""
        if not isinstance(error, FileNotFoundError):  # the trial folder is gone: the writer reports that
            self.warn("bp-publish", f"comgra cannot publish the run state in {str(self.trial_dir)!r}: {error}")


# -- helpers ---------------------------------------------------------------------------------------
def _value_metrics(watching: list[ActiveBreakpoint]) -> tuple[str, ...]:
    return tuple(sorted({name for b in watching for name in b.condition.value_metrics}))


def _gradient_metrics(watching: list[ActiveBreakpoint]) -> tuple[str, ...]:
    """grad_norm -> norm: the reductions of the gradient that the conditions read."""
    return tuple(sorted({name[len("grad_"):] for b in watching for name in b.condition.gradient_metrics}))


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return next((item for item in output if isinstance(item, torch.Tensor)), None)
    if isinstance(output, dict):
        return next((item for item in output.values() if isinstance(item, torch.Tensor)), None)
    return None

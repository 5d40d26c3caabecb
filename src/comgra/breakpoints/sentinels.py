"""Every-step sentinels: a few reductions of a handful of tensors on every training step, recorded or not.

The policy records one step in ten or a hundred; a NaN, an empty batch or a jump of the logits on a step in
between leaves no trace in the recorded steps (or shows later, far from where it began). Sentinels keep a
light series for every step: per watched tensor (by default the losses, ``is_loss=True``, and the tensors
that the recorded steps' graphs show as outputs; or the names the user marks with
``recorder.set_sentinels(["logits", ...])``) the NaN and infinity flags, the smallest and largest value, the
largest magnitude and the L2 norm, and per step the batch size. The inputs and targets (``is_input=True``,
``is_target=True``; ``comgra.watch`` gives the model's tensor inputs, token ids, masks and labels too) are
watched by default as well: an input all zeros or constant on a step shows as value_min == value_max (an integer or
boolean input, token ids, masks, labels, gets its smallest and largest value only, taken from the integers as they
are: no copy, and a NaN norm). They are the reductions breakpoints use (``torch.aminmax`` gives min, max
and the NaN flag in one kernel, ``vector_norm`` the norm), taken at registration (the value as registered). A small
CPU tensor (up to 65,536 values) is kept at registration instead and reduced at finish_batch, with the step's others,
in one call of comgra's C kernel (capture/fused.py): the inputs, targets and loss of a small model cost one call per
step, not five torch calls each. Its value at the step's end is its value as registered unless it was changed in
place in between: its version counter shows that, and from the next step on that name is reduced at registration.
An unrecorded step whose watched tensors are all on the CPU is held, and the steps held are reduced and read
together, in one kernel call, every ``HOLD_STEPS`` steps or ``HOLD_SECONDS`` (and at every recorded step, flush, pause
and the run's end; at most ``HOLD_VALUES`` values held, small tensors of the user's kept alive that long): each visit
of this code from a training step finds the CPU's caches cold (a call that takes 2 us in a loop takes 20 there), and
one visit per 16 steps instead of one per step cut comgra's calls of an unrecorded 2.5 ms MLP step by a third
(``benchmarks/unrecorded_step.py``). A held tensor with autograd history is held detached (its graph is not kept).
Its NaN is then said up to ``HOLD_SECONDS`` later; a step that came more than ``HOLD_SECONDS`` after the last one is
not held, and ``pause_on_error=True`` reads every step in the step itself.

On CUDA the results of a step are copied to pinned host memory without waiting and read one step later,
when the copy is long done: no step waits on the GPU for them. On the CPU they are read at once. A step with
an error (NaN, infinity, an empty tensor or batch) is an *event*: said once per tensor and kind (a log record
of level WARNING, logger ``comgra.sentinels``) and as a note (the Notes tab), and with ``pause_on_error=True``
the step pauses like a breakpoint (the same control channel: continue, step, abort), in which case its values
are read in the step itself.

    >>> recorder.set_sentinels(["logits"], pause_on_error=True)   # doctest: +SKIP
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import torch

from comgra.breakpoints.conditions import parse_condition
from comgra.errors import RecordingError
from comgra.store import format as fmt

__all__ = ["Sentinels"]

log = logging.getLogger("comgra.sentinels")

ROWS_PER_TABLE = 2048  # rows buffered before they go to the writer (and at every flush and pause)
# All-CPU steps held before their small tensors are reduced and read together (see the module): at most this many
# steps, this many values (the tensors held alive: 8 MiB of float64 at most) and this long since the first one.
HOLD_STEPS = 16
HOLD_VALUES = 1 << 20
HOLD_SECONDS = 0.5
ERROR_EVENTS = ("nan", "inf", "empty", "zero_batch")
_SCHEMA = pa.schema([*fmt.SENTINELS_SCHEMA, *fmt.ADDED_COLUMNS["sentinels"]])  # the rows, with value_min, value_max
_WORDS = {"nan": "a NaN", "inf": "an infinite value", "empty": "no elements", "zero_batch": "an empty batch"}


@dataclass
class _Step:
    """The sentinel values of one training step, until they are read."""

    training_step: int
    type_of_execution: str | None
    batch_size: int
    recorded: bool
    names: list[tuple[str, str, int]] = field(default_factory=list)  # (name, source, numel) of each reduced tensor
    # per tensor: (min, max, norm), as three 0-d tensors on its device (norm None: an integer input, which has none),
    # or as floats where they cost nothing to read (a CPU scalar: the loss; any tensor on the CPU)
    parts: list[tuple[Any, Any, Any]] = field(default_factory=list)
    inputs: set[int] = field(default_factory=set)  # id() of the input tensors reduced (one tensor, two names: once)
    seen: set[str] = field(default_factory=set)  # the names in ``names``
    host: torch.Tensor | None = None  # the stacked tensor results on the host (pinned, filled asynchronously on CUDA)
    # small CPU tensors, reduced at finish_batch, all in one kernel call: (index in parts, tensor, is_input, version)
    pending: list[tuple[int, torch.Tensor, bool, int | None]] = field(default_factory=list)
    ready: Any = None  # the CUDA event after the copy; None: ``host`` is complete
    on_device: bool = False  # a part is a device tensor's reductions (stacked and copied at finish_batch)
    values: int = 0  # the values of the tensors in ``pending``


class Sentinels:
    """Owned by the recorder; the recorder calls it at start_batch, register_tensor, finish_batch and finalize."""

    def __init__(self, *, put: Callable[[pa.Table], None], warn: Callable[[str, str], None],
                 note: Callable[[str], None], monitor: Any = None, distributed: bool = False):
        self.put, self.warn, self.note = put, warn, note
        self.monitor = monitor  # the breakpoint monitor whose pause a sentinel error can use (None: no pause)
        self.distributed = distributed
        self.enabled = True
        self.marked: frozenset[str] | None = None  # None: losses and outputs
        self.pause_on_error = False
        self.inputs = True  # the inputs and targets too (False: the losses and outputs only; benchmarks/input_sentinel_cost.py)
        self.outputs: set[str] = set()  # output tensors' names, learned from the recorded steps' graphs
        self.step: _Step | None = None
        self._waiting: _Step | None = None  # the previous step's results, read at the next step (CUDA)
        self._held: list[_Step] = []  # all-CPU steps not read yet, in order (see HOLD_STEPS)
        self._held_values = 0  # the values of the tensors they hold
        self._held_since = 0.0  # time.perf_counter() at the first of them
        self._last_finish = -math.inf  # time.perf_counter() at the last finish_batch
        # The rows so far, column by column in the order of _SCHEMA: numbers, strings, booleans and None only, which the
        # garbage collector does not track (a tuple per row would: on a 2-core run its full collections, set off by
        # the rows kept, cost more than the sentinels themselves).
        self._columns: tuple[list[Any], ...] = _no_rows()
        self._said: set[tuple[str, str]] = set()
        self.events: list[tuple[int, str, str]] = []  # (training_step, name, event) of the errors seen so far
        # The C kernel of capture/fused.py, given by capture.evidence: a CPU tensor of up to ``defer_up_to`` values is
        # kept at registration and reduced at finish_batch with the step's others in one call (``spec``: its
        # address, size and kind, or None where the kernel cannot read it; ``reduce_many``: [min, max, sum of
        # squares] of each; floats up to ``defer_floats_up_to``). 0: every tensor reduced in torch at registration.
        self.defer_up_to = self.defer_floats_up_to = 0
        self.spec: Callable[[torch.Tensor], tuple[int, int, int] | None] | None = None
        self.reduce_many: Callable[[list[tuple[int, int, int]]], list[list[float]]] | None = None
        self.in_place: set[str] = set()  # names seen changed in place after their registration: reduced at registration
        # Names ``wants`` said no to, registered with no flag (neither loss nor input): the recorder skips them at once
        # on a step that takes nothing else (no call). The same set throughout, emptied where the rule's inputs change.
        self.unwatched: set[str] = set()

    @classmethod
    def attach(cls, recorder: Any) -> Sentinels:
        """Wired to the recorder's session (rows, warnings, notes) and breakpoint monitor (pauses)."""
        session, breakpoints = recorder.session, recorder._breakpoints

        def put(table: pa.Table) -> None:
            if session is not None:
                session.put_table("sentinels", table)
        # Said through logging, not warnings: a NaN of the user's is no fault of the recording, and a test suite
        # that makes warnings errors must not fail on it (logging prints a WARNING where nothing is configured).
        return cls(put=put, warn=lambda key, message: log.warning("%s", message),
                   note=session.add_note if session is not None else (lambda note: None),
                   monitor=breakpoints.monitor if breakpoints is not None else None,
                   distributed=recorder.rank_info.world_size > 1)

    def configure(self, names: Iterable[str] | None, *, enabled: bool, pause_on_error: bool) -> None:
        if names is not None and (isinstance(names, str) or not all(isinstance(n, str) and n for n in names)):
            raise RecordingError(f"set_sentinels(names={names!r}) needs a list of registered tensor names, e.g. "
                                 "['loss', 'logits'], or None for the losses and outputs.")
        self.marked = None if names is None else frozenset(names)
        self.enabled, self.pause_on_error = bool(enabled), bool(pause_on_error)
        self.unwatched.clear()

    # -- the training step ------------------------------------------------------------------------------
    def start_batch(self, training_step: int, type_of_execution: str | None, batch_size: int, recorded: bool) -> None:
        if not self.enabled:
            self.step = None
            return
        self.step = _Step(training_step, type_of_execution, int(batch_size), recorded)

    def wants(self, name: str, is_loss: bool, is_input: bool = False) -> bool:
        """Whether ``register_tensor(name, ...)`` is watched this step (a set lookup)."""
        if self.step is None:
            return False
        watched = name in self.marked if self.marked is not None else \
            (is_loss or (is_input and self.inputs) or name in self.outputs)
        if not (watched or is_loss or is_input):
            self.unwatched.add(name)
        return watched

    def register(self, name: str, tensor: torch.Tensor, is_loss: bool, is_input: bool = False) -> None:
        step = self.step
        assert step is not None
        if name in step.seen:
            return  # registered twice in a step (iterations): its first value stands for the step
        if is_input:
            if id(tensor) in step.inputs:
                return  # the user's input, which comgra.watch also finds as the model's
            step.inputs.add(id(tensor))
        step.seen.add(name)
        source = "marked" if self.marked is not None else "loss" if is_loss else "input" if is_input else "output"
        count = tensor.numel()
        if tensor.is_cpu and count <= self.defer_up_to and name not in self.in_place and (
                count <= self.defer_floats_up_to or not tensor.is_floating_point()):
            # Kept as it is (no torch call: each costs 5-20 us of CPU in a training step), read at finish_batch; a
            # tensor the kernel will not take is reduced here, while its values are still in the cache.
            try:
                version: int | None = tensor._version
            except RuntimeError:  # an inference tensor has no version counter
                version = None
            if tensor.requires_grad:  # held past the step maybe: not its autograd graph (the same values and version)
                tensor = tensor.detach()
            step.values += count
            step.names.append((name, source, -1))  # its number of values is taken at the end
            step.pending.append((len(step.parts), tensor, is_input, version))
            step.parts.append((math.nan, math.nan, math.nan))
            return
        count, part = _reduce(tensor, is_input)
        step.names.append((name, source, count))
        step.parts.append(part)
        if not isinstance(part[0], float):
            step.on_device = True

    def _moved(self, step: _Step) -> None:
        """A pending tensor changed in place since its registration (its version moved): its name is reduced at
        registration from the next step on (this step's value is read as it is now)."""
        for index, tensor, _, version in step.pending:
            if version is not None and tensor._version != version:
                self.in_place.add(step.names[index][0])

    def _reduce_pending(self, steps: list[_Step]) -> None:
        """The small CPU tensors of ``steps``, reduced in one call of the kernel (those it cannot read in torch). A
        tensor changed in place since its registration is read as it is now (see ``_moved``)."""
        specs: list[tuple[int, int, int]] = []
        targets: list[tuple[_Step, int]] = []
        held = []
        for step in steps:
            pending, step.pending = step.pending, []
            held.append(pending)
            for index, tensor, is_input, version in pending:
                name, source, _ = step.names[index]
                if version is not None and tensor._version != version:
                    self.in_place.add(name)
                spec = self.spec(tensor) if self.spec is not None else None
                if spec is None:
                    count, step.parts[index] = _reduce(tensor, is_input)
                else:
                    count = spec[1]
                    specs.append(spec)
                    targets.append((step, index))
                step.names[index] = (name, source, count)
        if specs:
            assert self.reduce_many is not None
            for (step, index), (low, high, squares) in zip(targets, self.reduce_many(specs)):
                step.parts[index] = (low, high, math.sqrt(squares))
        del held  # the tensors are let go only after the kernel has read them

    def finish_batch(self, *, pausable: bool) -> None:
        """The step's reductions go to the host; the previous step's (CUDA) or this step's (CPU) are read, or this step
        is held with the others (an unrecorded step all on the CPU: see the module)."""
        step, self.step = self.step, None
        if step is None:
            return
        pause = self.pause_on_error and pausable
        now = time.perf_counter()
        slow, self._last_finish = now - self._last_finish > HOLD_SECONDS, now  # a slow step is read at once
        if not (step.on_device or pause or step.recorded or slow):  # all on the CPU: held (see the module)
            if step.pending:
                self._moved(step)
            waiting, self._waiting = self._waiting, None
            if waiting is not None:
                self._read(waiting, pausable=False)
            held = self._held
            held.append(step)
            if len(held) == 1:
                self._held_since = now
            self._held_values += step.values
            if len(held) >= HOLD_STEPS or self._held_values > HOLD_VALUES or now - self._held_since > HOLD_SECONDS:
                self._read_held()
            return
        self._read_held()
        if step.pending:
            self._reduce_pending([step])
        if step.on_device:
            _start_transfer(step)
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            self._read(waiting, pausable=False)
        if step.ready is None or (self.pause_on_error and pausable):
            self._read(step, pausable=pausable)
        else:
            self._waiting = step

    def learn_outputs(self, graph: dict[str, Any]) -> None:
        """The output tensors of a recorded iteration's graph (role ``output``) become default sentinels."""
        known = len(self.outputs)
        for node in graph.get("nodes", []):
            if node.get("role") == "output" and int(node.get("iteration_offset", 0) or 0) == 0:
                self.outputs.update(str(role) for role in node.get("roles", [node.get("node")]))
        if len(self.outputs) != known:
            self.unwatched.clear()  # (in place: the recorder holds this set)

    def _read_held(self) -> None:
        """The steps held so far, reduced in one kernel call and read in order."""
        held, self._held, self._held_values = self._held, [], 0
        if held:
            self._reduce_pending([step for step in held if step.pending])
            for step in held:
                self._read(step, pausable=False)

    def close(self) -> None:
        self._read_held()
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            self._read(waiting, pausable=False)
        self._put_rows()

    # -- reading -----------------------------------------------------------------------------------------
    def _read(self, step: _Step, *, pausable: bool) -> None:
        if step.ready is not None:
            step.ready.synchronize()
        parts = step.parts
        if step.host is not None:
            read = iter(step.host.tolist())
            parts = [part if isinstance(part[0], float) else (next(read), next(read), math.nan if part[2] is None else
                                                              next(read)) for part in parts]
        step.parts = []
        errors: list[tuple[str, str]] = []
        for (name, source, count), (low, high, norm) in zip(step.names, parts):
            if -math.inf < low <= high < math.inf:  # the usual case: finite values (a NaN fails every comparison)
                self._add(name, source, count, False, False, high if high > -low else -low, norm, None, low, high)
                continue
            nan = count > 0 and math.isnan(high)
            inf = not nan and (math.isinf(low) or math.isinf(high))
            event = "nan" if nan else "inf" if inf else "empty" if count == 0 else None
            self._add(name, source, count, nan, inf, math.nan if nan else max(abs(low), abs(high)), norm, event, low,
                      high)
            if event is not None:
                errors.append((name, event))
        self._add("batch", "batch", step.batch_size, False, False, math.nan, math.nan,
                  "zero_batch" if step.batch_size == 0 else None, math.nan, math.nan)
        rows = len(step.names) + 1  # the columns that are the step's, for all its rows at once
        columns = self._columns
        columns[0].extend([step.training_step] * rows)
        columns[1].extend([step.type_of_execution] * rows)
        columns[9].extend([step.recorded] * rows)
        if step.batch_size == 0:
            errors.append(("batch", "zero_batch"))
        for name, event in errors:
            self._event(step, name, event, pausable)
        if len(columns[0]) >= ROWS_PER_TABLE or errors:
            self._put_rows()

    def _add(self, name: str, source: str, count: int, nan: bool, inf: bool, abs_max: float, norm: float,
             event: str | None, low: float, high: float) -> None:
        """A row less the step's columns (training_step, type_of_execution, recorded: ``_read`` adds them)."""
        columns = self._columns
        columns[2].append(name)
        columns[3].append(source)
        columns[4].append(count)
        columns[5].append(nan)
        columns[6].append(inf)
        columns[7].append(abs_max)
        columns[8].append(norm)
        columns[10].append(event)
        columns[11].append(low)
        columns[12].append(high)

    def _event(self, step: _Step, name: str, event: str, pausable: bool) -> None:
        self.events.append((step.training_step, name, event))
        if (name, event) not in self._said:
            self._said.add((name, event))
            recorded = "a recorded step" if step.recorded else "a step the policy did not record"
            message = (f"comgra sentinel: {name!r} holds {_WORDS[event]} at training step {step.training_step} "
                       f"({recorded}); the sentinels table has every step, and `comgra scan` says where it began.")
            self.warn(f"sentinel:{name}:{event}", message)
            self.note(message)
        if pausable and self.pause_on_error:
            self._pause(name, event)

    def _pause(self, name: str, event: str) -> None:
        """Pause at this step's finish_batch, as a breakpoint that held (the monitor's hit)."""
        monitor = self.monitor
        if monitor is None or self.distributed or monitor.step.hit is not None:
            return  # torch.distributed: the ranks agree on breakpoints of the shared list only; a sentinel is not one
        from comgra.breakpoints.monitor import ActiveBreakpoint

        metric = {"nan": "has_nan > 0", "inf": "has_inf > 0"}.get(event, "abs_max != abs_max")
        monitor.step.hit = ActiveBreakpoint(f"sentinel-{event}", name, parse_condition(metric), False)
        monitor.step.held.add(monitor.step.hit.id)

    def _put_rows(self) -> None:
        if not self._columns[0]:
            return
        columns, self._columns = self._columns, _no_rows()
        self.put(pa.table(dict(zip(_SCHEMA.names, columns)), schema=_SCHEMA))

    def flush(self) -> None:
        """Hand the rows so far to the writer (the recorder's flush and a pause)."""
        self._read_held()
        self._put_rows()


def _no_rows() -> tuple[list[Any], ...]:
    return tuple([] for _ in _SCHEMA.names)


def _reduce(tensor: torch.Tensor, is_input: bool) -> tuple[int, tuple[Any, Any, Any]]:
    """The number of values and (min, max, norm) of a tensor in torch: floats where they cost nothing to read (a CPU
    tensor), else three 0-d tensors on its device (norm None: an integer input, which has none)."""
    # Each torch call costs 10-20 us of CPU in a training step (cold caches; 1-2 us in a loop): no detach where
    # nothing needs it (the reductions and item() keep no autograd history of a tensor without one)
    data = tensor.detach() if tensor.requires_grad else tensor
    if hasattr(data, "to_local"):  # a DTensor: this rank's shard (its global reduction would be a collective)
        data = data.to_local()
    count = data.numel()
    if count == 0 or data.is_nested:
        return count, (math.nan, math.nan, math.nan)
    if count == 1 and data.device.type == "cpu" and not data.is_complex():  # a loss: read now, no kernel
        value = float(data.item())
        return count, (value, value, abs(value))
    norm: Any = math.nan
    if data.is_complex():
        data = data.abs()
    elif not data.is_floating_point():
        if is_input:  # token ids, masks, labels: their smallest and largest value, of the integers (no copy, no norm)
            low, high = torch.aminmax(data)
            return count, ((float(low.item()), float(high.item()), norm) if data.device.type == "cpu"
                           else (low, high, None))
        data = data.double()
    low, high = torch.aminmax(data)  # two kernels
    norm = torch.linalg.vector_norm(data)
    if data.device.type == "cpu":  # read now (the kernels have run): three reads cost less than a stack
        return count, (float(low.item()), float(high.item()), float(norm.item()))
    return count, (low, high, norm)  # stacked and copied to the host at finish_batch, read a step later


def _start_transfer(step: _Step) -> None:
    """Stack the step's reductions and start their copy to the host (asynchronous on CUDA)."""
    reduced = [part for part in step.parts if not isinstance(part[0], float)]
    if not reduced:
        step.host = None
        return
    first = reduced[0][0]
    values = [value for part in reduced for value in part if value is not None]  # None: an integer input's norm
    if any(part[0].device != first.device for part in reduced):  # rare: tensors on several devices (a sync each)
        values = [value.double().cpu() for value in values]
    elif any(part[0].dtype != first.dtype for part in reduced):  # bfloat16 logits beside a float32 loss: on the device
        values = [value.double() for value in values]
    stacked = torch.stack(values)
    if not stacked.is_floating_point():  # integer inputs' extremes alone
        stacked = stacked.double()
    if stacked.device.type != "cuda":
        step.host = stacked.cpu()
        return
    step.host = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
    step.host.copy_(stacked, non_blocking=True)
    step.ready = torch.cuda.Event()
    step.ready.record()

"""Per-layer profiling of the modules given to ``track_module(name, module, profile=True)``.

Every submodule is measured under its dotted name (``net.b1.attn``) on every training step (or every
``every``-th, see ``ProfileOptions``):
forward and backward time, the bytes of its outputs (and, on CUDA, allocated memory), and, while a
torch profiler runs, it appears as a ``torch.profiler.record_function`` range named after it, so that
a user's own torch.profiler trace shows the modules. On the steps the recorder records, the
statistics of each module's output and the norm of its parameters' gradients are added; on the steps
asked for, its forward FLOPs (``torch.utils.flop_counter.FlopCounterMode``). Rows go to the
``layers`` table; the last ``history`` executions of each layer stay in memory (``history()``).

Cost: a module's forward is measured by a wrapper set on its class while the profiler is active
(``forward_wrappers``: no forward hooks, so ``nn.Module.__call__`` keeps its fast path, and nothing on
the instances, so deepcopy, pickle and torch.save see plain modules); forward hooks remain only where
a wrapper cannot be used. Each call does only what must happen at that moment (read the clock, note
the output's size, put a marker on the output's autograd node) into a plain list; the backward
attribution, wall-clock times and rows are worked out once per step, and the Arrow table once per
flush. Parameters carry gradient hooks only on the steps the recorder records (for the gradient
norms). Calls made while a graph is traced (torch.compile, torch.jit.trace, torch.fx) are not
measured: they are not executions.

Clocks: ``time.perf_counter`` on CPU. On a GPU a mark is a CUDA event recorded in the hook; a step's
events are read once the last of them has completed (``Event.query``, which never blocks), so the
profiler makes no host synchronisation, neither per module nor per step; statistics come to the
host by non-blocking copies. Only ``take(force=True)`` at the end of a run waits for the last step.

Backward time: a prehook on the autograd node that made a module call's output notes when the
gradient reaches it, and the autograd engine's final callback notes when the backward pass ends; a
call without parameters also notes when its inputs' gradient is complete. ``backward_slices`` cuts
the pass at these moments and gives each slice to one call, so that a call's backward time is its
own slices and those of the calls nested in it: a parent contains its children, and a module called
several times in a step (its parameters' gradients accumulated once for all its calls) is not
counted once per call on top of the others. No ``register_full_backward_hook`` (which breaks
training code that modifies a module's output in place, e.g. ``x += ...``, and puts two extra
autograd nodes around every module).
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pyarrow as pa
import torch
from torch.utils.flop_counter import FlopCounterMode

from comgra.capture import backward_slices, forward_wrappers
from comgra.errors import ConfigError
from comgra.store import format as fmt

DEFAULT_HISTORY = 100
_profiler_enabled = torch._C._autograd._profiler_enabled  # True while a torch.profiler (or autograd profiler) runs
_tracing_state = torch._C._get_tracing_state  # not None inside torch.jit.trace
_is_compiling = torch.compiler.is_compiling  # True while TorchDynamo traces (torch.compile)
# True inside torch.fx.symbolic_trace (older torch: is_fx_tracing, which newer torch makes log a warning)
_is_fx_tracing = getattr(torch.fx._symbolic_trace, "is_fx_symbolic_tracing", None) or torch.fx._symbolic_trace.is_fx_tracing
_FIELDS = tuple(fmt.LAYERS_SCHEMA.names)
# Runs a callable once the current backward pass has finished (what DistributedDataParallel uses for its final callback).
_queue_engine_callback = torch.autograd.Variable._execution_engine.queue_callback

# One execution of one module is a list (the cheapest mutable record to make in a hook), indexed by:
# _SUBTREE_END: the number of records when its forward returned (its nested calls are the records before that).
_LAYER, _FORWARD_START, _FORWARD_END, _BYTES, _BACKWARD_START, _BACKWARD_END, _EXTRA, _SUBTREE_END = range(8)


@dataclass(frozen=True)
class ProfileOptions:
    """``history``: executions kept in memory per layer. ``flops_every``: count FLOPs on every n-th step
    (None: on the first profiled step only, the usual case for a model whose shapes do not change;
    0: never). ``every``: profile every n-th training step (and every step the recorder records);
    the hooks of the other steps return at once, so this is the knob for the profiler's cost."""

    history: int = DEFAULT_HISTORY
    flops_every: int | None = None
    every: int = 1

    def __post_init__(self) -> None:
        for name, low in (("history", 1), ("every", 1)):
            value = getattr(self, name)
            if type(value) is not int or value < low:  # noqa: E721 - True is no count
                raise ConfigError(f"profile {name}={value!r} must be an int >= {low}, e.g. {DEFAULT_HISTORY if name == 'history' else 1}.")
        if self.flops_every is not None and (type(self.flops_every) is not int or self.flops_every < 0):  # noqa: E721
            raise ConfigError(f"profile flops_every={self.flops_every!r} must be None (first step only), 0 (never) "
                              "or an int >= 1 (every n-th step).")


class _Extra:
    """What only some steps measure (CUDA memory, FLOPs, statistics) or a running torch profiler needs."""

    __slots__ = ("cuda_before", "cuda_allocated_delta", "cuda_peak", "flops_before", "forward_flops",
                 "statistics", "scope")

    def __init__(self) -> None:
        self.cuda_before: int | None = None
        self.cuda_allocated_delta: int | None = None
        self.cuda_peak: int | None = None
        self.flops_before: int | None = None
        self.forward_flops: int | None = None
        self.statistics: Any = None  # a tensor [mean, std, abs_max, nan_count] on the output's device
        self.scope: Any = None  # the record_function range, while a torch profiler runs


class _Layer:
    __slots__ = ("name", "module", "parameter_indices", "open", "history", "needs_input_marks")

    def __init__(self, name: str, module: torch.nn.Module, history: int, parameter_indices: list[int]):
        self.name = name
        self.module = module
        self.parameter_indices = parameter_indices  # of every trainable parameter in its subtree
        # A call of a module without parameters ends its backward slice when its inputs' gradient is complete
        # (markers on every input cost more, so a module with parameters has none: see backward_slices).
        self.needs_input_marks = not parameter_indices
        self.open: list[list[Any]] = []  # forward calls in progress (recursion-safe)
        self.history: deque[tuple[Any, ...]] = deque(maxlen=history)


class _StepCapture:
    """The raw marks of one profiled step, until they can be read (at once on CPU; on CUDA once its
    last event has completed)."""

    __slots__ = ("step", "records", "finishes", "start", "host_start", "statistics", "grad_norms", "ready")

    def __init__(self, step: int, records: list[list[Any]], finishes: list[Any], start: Any, host_start: float):
        self.step, self.records, self.finishes = step, records, finishes  # finishes: the ends of backward passes
        self.start, self.host_start = start, host_start
        self.statistics: list[tuple[list[list[Any]], torch.Tensor]] = []  # (records, host values) per device
        self.grad_norms: list[tuple[list[int], torch.Tensor]] = []  # (parameter indices, host norms) per device
        self.ready: Any = None  # CUDA: an event recorded after everything of the step


class Profiler:
    """Hooks on the profiled modules while a recorder is alive; ``close()`` removes every one.

    ``cuda``: use CUDA events as the clock (None: where a profiled module has a CUDA parameter)."""

    def __init__(self, options: ProfileOptions = ProfileOptions(), *, cuda: bool | None = None):
        self.options = options
        self._layers: list[_Layer] = []
        self._by_module: dict[int, _Layer] = {}
        self._parameter_index: dict[int, int] = {}
        self._parameters: list[torch.Tensor] = []  # by index
        self._handles: list[Any] = []
        self._norm_handles: list[Any] = []  # gradient hooks, on recorded steps only
        self._attached: list[torch.nn.Module] = []  # modules measured by a class-level forward wrapper
        self._forced_cuda = cuda
        self._cuda = bool(cuda)
        self._clock: Callable[[], Any] = _cuda_event if self._cuda else time.perf_counter
        self._step: int | None = None
        self._steps_seen = 0
        self._detail = False
        self._extras = False  # detail, FLOPs or CUDA memory: the hooks take the slower path
        self._records: list[list[Any]] | None = None  # None: this step is not profiled, the hooks return at once
        self._finishes: list[Any] | None = None  # the end of each backward pass of the step
        self._finish_queued = False
        self._grad_norms: dict[int, torch.Tensor] = {}
        self._flops: FlopCounterMode | None = None
        self._flops_counted = False
        self._step_start: Any = None
        self._step_host = 0.0
        self._epoch = (time.time(), time.perf_counter())  # maps perf_counter onto the wall clock
        self._pending: deque[_StepCapture] = deque()
        self._rows: list[tuple[Any, ...]] = []
        self._rows_since = 0.0
        self._last_node: Any = None  # the autograd node of the last prehook registered, and its records
        self._last_node_records: list[list[Any]] = []
        self.error: BaseException | None = None  # a fault inside a hook: profiling stops, training goes on

    # -- setup ------------------------------------------------------------------------------
    def add(self, root_name: str, module: torch.nn.Module) -> None:
        """Profile ``module`` and each of its submodules, named ``root_name.child.grandchild``."""
        for dotted, submodule in module.named_modules():
            if id(submodule) in self._by_module:
                continue  # a module reached twice is profiled once, under its first name
            indices = [self._watch_parameter(p) for p in submodule.parameters() if p.requires_grad]
            layer = _Layer(f"{root_name}.{dotted}" if dotted else root_name, submodule, self.options.history, indices)
            self._layers.append(layer)
            self._by_module[id(submodule)] = layer
            if forward_wrappers.attach(submodule, self._forward_handler(layer)):
                self._attached.append(submodule)
            else:  # TorchScript, an instance's own forward attribute, ...: hooks (nn.Module's slower call path)
                before, after = self._hooks(layer)
                self._handles.append(submodule.register_forward_pre_hook(before))
                self._handles.append(submodule.register_forward_hook(after))
            if self._forced_cuda is None and any(p.is_cuda for p in submodule.parameters(recurse=False)):
                self._cuda, self._clock = True, _cuda_event

    def _watch_parameter(self, parameter: torch.Tensor) -> int:
        index = self._parameter_index.get(id(parameter))
        if index is None:
            index = self._parameter_index[id(parameter)] = len(self._parameters)
            self._parameters.append(parameter)
        return index

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._remove_norm_hooks()
        for module in self._attached:
            forward_wrappers.detach(module)
        self._attached = []
        self._records = self._finishes = None
        self._end_flops()
        self._layers, self._by_module, self._parameter_index, self._parameters = [], {}, {}, []

    @property
    def layer_names(self) -> list[str]:
        return [layer.name for layer in self._layers]

    def history(self, name: str) -> list[dict[str, Any]]:
        """The last ``options.history`` executions of a layer, oldest first (the rows of the layers table)."""
        for layer in self._layers:
            if layer.name == name:
                return [dict(zip(_FIELDS, row)) for row in layer.history]
        raise ConfigError(f"No profiled layer {name!r}; profiled: {self.layer_names[:12]}")

    # -- one training step --------------------------------------------------------------------
    def start_step(self, training_step: int, *, detail: bool) -> None:
        """``detail``: also activation statistics and gradient norms (the recorder records this step).

        Every ``options.every``-th step is profiled, and every step the recorder records; on the others
        the hooks return at once."""
        self._steps_seen += 1
        self._records = self._finishes = None
        self._remove_norm_hooks()
        if self.error is not None or (not detail and (self._steps_seen - 1) % self.options.every):
            return
        self._step, self._detail = training_step, detail
        self._grad_norms = {}
        every, seen = self.options.flops_every, self._steps_seen - 1
        if (every is None and not self._flops_counted) or (every and seen % every == 0):
            self._flops_counted = True
            self._flops = FlopCounterMode(display=False)
            self._flops.__enter__()
        self._extras = detail or self._cuda or self._flops is not None
        self._step_host = time.perf_counter()
        self._step_start = self._clock()
        self._records, self._finishes, self._finish_queued = [], [], False
        self._last_node, self._last_node_records = None, []
        if detail:  # each gradient's norm when it is complete: before an optimizer may zero it
            self._norm_handles = [parameter.register_post_accumulate_grad_hook(partial(self._parameter_done, index))
                                  for index, parameter in enumerate(self._parameters)]

    def _remove_norm_hooks(self) -> None:
        for handle in self._norm_handles:
            handle.remove()
        self._norm_handles = []

    def finish_step(self) -> None:
        """Close the step: its marks wait until they can be read, its rows then wait for ``take``."""
        records, finishes = self._records, self._finishes
        self._records = self._finishes = None
        self._remove_norm_hooks()
        self._last_node, self._last_node_records = None, []  # nothing keeps the step's graph alive
        self._end_flops()
        for layer in self._layers:
            if layer.open:
                layer.open = []  # a forward that raised; nothing of this step outlives it
        if self.error is not None:
            raise self.error  # the recorder reports it once and switches profiling off
        if records is None or self._step is None:
            return
        capture = _StepCapture(self._step, records, finishes or [], self._step_start, self._step_host)
        if self._detail:
            capture.statistics = _to_host([(r, r[_EXTRA].statistics) for r in records
                                           if r[_EXTRA] is not None and r[_EXTRA].statistics is not None])
            capture.grad_norms = _to_host(list(self._grad_norms.items()))
            self._grad_norms = {}
        if self._cuda:
            capture.ready = _cuda_event()  # after every mark and copy of the step on this stream
        self._pending.append(capture)
        self._step = None
        self._convert_ready(force=False)

    def take(self, *, force: bool, max_age: float = 2.0, max_rows: int = 4096) -> pa.Table | None:
        """The pending rows as one table, when there are many or they are ``max_age`` seconds old (or
        ``force``): one Arrow conversion per flush, not one per step."""
        if force:
            self._convert_ready(force=True)
        if not self._rows or not (force or len(self._rows) >= max_rows
                                  or time.monotonic() - self._rows_since >= max_age):
            return None
        rows, self._rows = self._rows, []
        columns = zip(*rows)
        return pa.Table.from_arrays([pa.array(column, type=field.type) for column, field
                                     in zip(columns, fmt.LAYERS_SCHEMA)], schema=fmt.LAYERS_SCHEMA)

    def _end_flops(self) -> None:
        if self._flops is not None:
            mode, self._flops = self._flops, None
            mode.__exit__(None, None, None)

    # -- per call: only what must happen at that moment -----------------------------------------------
    def _forward_handler(self, layer: _Layer) -> forward_wrappers.Handler:
        """What the class-level wrapper calls for this layer's module: the forward, measured. The usual call of a
        plain profiled step takes a lean path written out here (a record, two clock reads, a backward marker),
        since its every step costs time on each module call; the others go through ``_begin`` and ``_end``."""
        profiler, full = self, layer.needs_input_marks

        def measured_forward(module: torch.nn.Module, forward: Callable[..., Any], args: tuple[Any, ...],
                             kwargs: dict[str, Any]) -> Any:
            if _is_compiling() or _tracing_state() is not None or _is_fx_tracing():  # _traced(), written out
                return forward(module, *args, **kwargs)  # and first: torch.compile must not guard on _records
            records = profiler._records
            if records is None:
                return forward(module, *args, **kwargs)
            if full or profiler._extras or _profiler_enabled():
                return profiler._measured_in_full(layer, module, forward, args, kwargs)
            clock = profiler._clock
            record = [layer, clock(), None, 0, None, None, None, None]
            records.append(record)
            try:
                output = forward(module, *args, **kwargs)
            finally:
                record[_FORWARD_END], record[_SUBTREE_END] = clock(), len(records)
            if profiler._records is not records:
                return output  # the step ended (or profiling failed) while this forward ran
            try:
                if type(output) is torch.Tensor:
                    record[_BYTES], node = output.nbytes, output.grad_fn
                    if node is profiler._last_node and node is not None:
                        profiler._last_node_records.append(record)
                    elif node is not None:
                        profiler._mark_backward_start(node, record)
                else:
                    profiler._note_outputs(record, output)
            except Exception as error:  # noqa: BLE001 - a fault of ours never breaks the user's forward
                profiler._fail(error)
            return output

        return measured_forward

    def _measured_in_full(self, layer: _Layer, module: torch.nn.Module, forward: Callable[..., Any],
                          args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        record = self._begin(layer, args)
        if record is None:
            return forward(module, *args, **kwargs)
        try:
            output = forward(module, *args, **kwargs)
        except BaseException:
            self._abandon(record)
            raise
        self._end(record, output)
        return output

    def _hooks(self, layer: _Layer) -> tuple[Callable[..., None], Callable[..., None]]:
        """The fallback where no class-level wrapper can be used: forward hooks (recursion-safe by a stack)."""
        profiler = self

        def before_forward(module: torch.nn.Module, inputs: Any) -> None:
            if profiler._records is None:
                return
            record = profiler._begin(layer, inputs)
            if record is not None:
                layer.open.append(record)

        def after_forward(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            if layer.open and profiler._records is not None:
                profiler._end(layer.open.pop(), output)

        return before_forward, after_forward

    def _begin(self, layer: _Layer, inputs: Any) -> list[Any] | None:
        """A module's forward starts: a new record with its start time (None: not measured)."""
        records = self._records
        if records is None:
            return None
        try:
            record: list[Any] = [layer, None, None, 0, None, None, None, None]
            records.append(record)
            if self._extras or _profiler_enabled():
                self._begin_extras(layer, record)
            if layer.needs_input_marks:
                _mark_inputs(record, inputs, self._clock)
            record[_FORWARD_START] = self._clock()
            return record
        except Exception as error:  # noqa: BLE001 - a fault of ours never breaks the user's forward
            self._fail(error)
            return None

    def _end(self, record: list[Any], output: Any) -> None:
        """The forward returned: its end time, the output's bytes, a marker for the start of its backward."""
        try:
            record[_FORWARD_END] = self._clock()
            records = self._records
            if records is None:
                return  # the step ended (or profiling failed) while this forward ran
            record[_SUBTREE_END] = len(records)
            outputs = self._note_outputs(record, output)
            if record[_EXTRA] is not None:
                self._end_extras(record, outputs)
        except Exception as error:  # noqa: BLE001
            self._fail(error)

    def _note_outputs(self, record: list[Any], output: Any) -> list[torch.Tensor]:
        """The bytes of a module's output tensors, and a marker on the autograd node of the first that has one."""
        outputs = [output] if isinstance(output, torch.Tensor) else list(_tensors(output))
        record[_BYTES] = sum(t.nbytes for t in outputs)
        node = next((t.grad_fn for t in outputs if t.grad_fn is not None), None)
        if node is not None:
            self._mark_backward_start(node, record)
        return outputs

    def _abandon(self, record: list[Any]) -> None:
        """The user's forward raised: close a torch.profiler range this record opened; the error goes on."""
        if self._records is not None:
            record[_SUBTREE_END] = len(self._records)
        extra = record[_EXTRA]
        if extra is not None and extra.scope is not None:
            scope, extra.scope = extra.scope, None
            try:
                scope.__exit__(None, None, None)
            except Exception as error:  # noqa: BLE001
                self._fail(error)

    def _mark_backward_start(self, node: Any, record: list[Any]) -> None:
        """One output suffices: the gradient reaches a module's outputs together. A prehook on the node that
        made it runs when that gradient arrives (cheaper than Tensor.register_hook; it never changes the
        gradient). Registering it is most of a module call's cost, so a parent that returns its last child's
        output (the same node) joins the child's prehook instead of registering its own."""
        if node is self._last_node:
            self._last_node_records.append(record)
            return
        records: list[list[Any]] = [record]
        node.register_prehook(partial(self._backward_reached, records))
        self._last_node, self._last_node_records = node, records

    def _backward_reached(self, records: list[list[Any]], _gradients: Any) -> None:
        """A grad_fn prehook on modules' output: notes when its gradient arrives (returns None: never changes it);
        the first of a backward pass asks the engine to note when that pass ends."""
        moment = self._clock()
        for record in records:
            if record[_BACKWARD_START] is None:
                record[_BACKWARD_START] = moment
        if not self._finish_queued and self._finishes is not None:
            self._finish_queued = True
            try:
                _queue_engine_callback(self._backward_finished)
            except Exception as error:  # noqa: BLE001 - a fault of ours never breaks the user's backward
                self._fail(error)

    def _backward_finished(self) -> None:
        self._finish_queued = False
        if self._finishes is not None:
            self._finishes.append(self._clock())

    def _parameter_done(self, index: int, parameter: torch.Tensor) -> None:
        if self._records is None:
            return
        try:
            if parameter.grad is not None:
                # Now, not at finish_batch: by then an optimizer may have zeroed the gradient. A tensor, no sync.
                self._grad_norms[index] = torch.linalg.vector_norm(parameter.grad.detach().float())
        except Exception as error:  # noqa: BLE001
            self._fail(error)

    def _begin_extras(self, layer: _Layer, record: list[Any]) -> None:
        extra = record[_EXTRA] = _Extra()
        if _profiler_enabled():  # a user's torch.profiler runs: name the range after the module
            extra.scope = torch.profiler.record_function(layer.name)
            extra.scope.__enter__()
        if self._cuda:
            extra.cuda_before = torch.cuda.memory_allocated()  # the caching allocator's counter: no sync
        if self._flops is not None:
            extra.flops_before = self._flops.get_total_flops()

    def _end_extras(self, record: list[Any], outputs: list[torch.Tensor]) -> None:
        extra = record[_EXTRA]
        if extra.scope is not None:
            extra.scope.__exit__(None, None, None)
            extra.scope = None
        if extra.cuda_before is not None:
            extra.cuda_allocated_delta = torch.cuda.memory_allocated() - extra.cuda_before
            extra.cuda_peak = torch.cuda.max_memory_allocated()
        if self._flops is not None and extra.flops_before is not None:
            extra.forward_flops = self._flops.get_total_flops() - extra.flops_before
        if self._detail:
            first = next((t for t in outputs if t.is_floating_point() and t.numel()), None)
            if first is not None:
                extra.statistics = _statistics_of(first.detach())

    def _fail(self, error: BaseException) -> None:
        self.error = error
        self._records = self._finishes = None

    # -- turning marks into rows, once per step ----------------------------------------------------
    def _convert_ready(self, *, force: bool) -> None:
        if force and self._pending and self._pending[-1].ready is not None:
            self._pending[-1].ready.synchronize()  # the end of the run; the last step's event comes after all others
        while self._pending:
            capture = self._pending[0]
            if not force and capture.ready is not None and not capture.ready.query():
                return  # the GPU is still busy with that step: read it later, never wait for it
            self._pending.popleft()
            rows = self._rows_of(capture)
            if rows and not self._rows:
                self._rows_since = time.monotonic()
            self._rows.extend(rows)

    def _rows_of(self, capture: _StepCapture) -> list[tuple[Any, ...]]:
        """One row per record, in the LAYERS_SCHEMA order; the hot loop of a profiled step's end (no call per mark
        on CPU, where a mark is a perf_counter reading and a fixed offset puts it on the wall clock)."""
        offset, seconds = self._seconds_of(capture)
        norms = {i: v for indices, values in capture.grad_norms for i, v in zip(indices, values.tolist())}
        statistics = {id(r): v for group, values in capture.statistics for r, v in zip(group, values.tolist())}
        grad_norms: dict[_Layer, float | None] = {}
        forward, backward_starts, backward_ends = [], [], []
        for record in capture.records:
            layer = record[_LAYER]
            if layer not in grad_norms:
                grad_norms[layer] = _grad_norm(layer, norms)
            if offset is None:
                forward.append((seconds(record[_FORWARD_START]), seconds(record[_FORWARD_END])))
                backward_starts.append(seconds(record[_BACKWARD_START]))
                input_end = seconds(record[_BACKWARD_END])
            else:
                start, end = record[_FORWARD_START], record[_FORWARD_END]
                forward.append((None if start is None else start + offset, None if end is None else end + offset))
                start, input_end = record[_BACKWARD_START], record[_BACKWARD_END]
                backward_starts.append(None if start is None else start + offset)
                input_end = None if input_end is None else input_end + offset
            backward_ends.append(input_end)
        finishes = [moment for moment in map(seconds, capture.finishes) if moment is not None]
        backward_times, backward_firsts = backward_slices.attribute(
            backward_starts, backward_ends, [record[_SUBTREE_END] for record in capture.records], finishes)
        calls: dict[_Layer, int] = {}
        clock, step, no_statistics = ("cuda_event" if self._cuda else "perf_counter"), capture.step, (None,) * 4
        rows = []
        for record, (forward_start, forward_end), backward_start, backward_time in zip(
                capture.records, forward, backward_firsts, backward_times):
            layer, extra = record[_LAYER], record[_EXTRA] or _NO_EXTRA
            call = calls[layer] = calls.get(layer, -1) + 1
            mean, std, abs_max, nans = statistics.get(id(record), no_statistics) if statistics else no_statistics
            row = (step, layer.name, call, clock, forward_start,
                   None if forward_start is None or forward_end is None else forward_end - forward_start,
                   None if backward_time is None else backward_start, backward_time, record[_BYTES],
                   extra.cuda_allocated_delta, extra.cuda_peak, extra.forward_flops, mean, std, abs_max,
                   None if nans is None else int(nans), grad_norms[layer])
            layer.history.append(row)
            rows.append(row)
        return rows

    def _seconds_of(self, capture: _StepCapture) -> tuple[float | None, Callable[[Any], float | None]]:
        """Marks as seconds on the wall clock (time.time scale): on CPU a fixed offset (also as a function),
        on CUDA (offset None) a function of the event."""
        if not self._cuda:
            offset = self._epoch[0] - self._epoch[1]
            return offset, lambda mark: None if mark is None else mark + offset
        # A CUDA event: its offset from the step's first event, placed at the host time of that event.
        base = self._epoch[0] + (capture.host_start - self._epoch[1])
        return None, lambda mark: None if mark is None else base + capture.start.elapsed_time(mark) / 1000.0

_NO_EXTRA = _Extra()


def _grad_norm(layer: _Layer, norms: dict[int, float]) -> float | None:
    """The L2 norm of the layer's parameters' gradients: the root of the sum of the squared norms taken when
    each gradient was complete."""
    squares = [norms[i] ** 2 for i in layer.parameter_indices if i in norms]
    return float(sum(squares) ** 0.5) if squares else None


def _traced() -> bool:
    """A module called while a graph is being traced rather than run: there is nothing to time."""
    return _is_compiling() or _tracing_state() is not None or _is_fx_tracing()


def _input_gradient_done(record: list[Any], clock: Callable[[], Any], _gradients: Any) -> None:
    if record[_BACKWARD_START] is not None:
        record[_BACKWARD_END] = clock()


def _mark_inputs(record: list[Any], inputs: Any, clock: Callable[[], Any]) -> None:
    for tensor in _tensors(inputs):
        node = tensor.grad_fn
        if node is not None:  # runs once the input's gradient is complete
            node.register_prehook(partial(_input_gradient_done, record, clock))


def _cuda_event() -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record()  # queued on the current stream: no sync
    return event


def _to_host(items: list[tuple[Any, torch.Tensor]]) -> list[tuple[list[Any], torch.Tensor]]:
    """Stack the scalars per device and start their copy to the host; a copy from a GPU is non-blocking
    (into pinned memory) and is read only once the step's last event has completed."""
    by_device: dict[Any, list[tuple[Any, torch.Tensor]]] = {}
    for key, tensor in items:
        by_device.setdefault(tensor.device, []).append((key, tensor))
    result = []
    for device, group in by_device.items():
        stacked = torch.stack([tensor for _, tensor in group])
        result.append(([key for key, _ in group], stacked if device.type == "cpu" else stacked.to("cpu", non_blocking=True)))
    return result


def _statistics_of(tensor: torch.Tensor) -> torch.Tensor:
    """[mean, std, abs_max, nan_count] on the tensor's device: five kernels, no host sync."""
    values = tensor.float()
    std, mean = torch.std_mean(values) if values.numel() > 1 else (values.new_zeros(()), values.mean())
    return torch.stack([mean, std, torch.linalg.vector_norm(values, float("inf")), torch.isnan(values).sum()])


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in a module's inputs or outputs (tensors, tuples, lists, dicts, ModelOutput)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)

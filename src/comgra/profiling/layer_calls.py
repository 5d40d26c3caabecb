"""Per module call: only what must happen at that moment, into a plain list per call.

A profiled module's forward is measured by the class-level wrapper of ``forward_wrappers`` (no
forward hooks, so ``nn.Module.__call__`` keeps its fast path); forward hooks remain only where a
wrapper cannot be used. A call of a plain profiled step reads the clock twice, notes its output's
size and puts one marker on the output, all written out in ``forward_handler``: everything else (the
backward attribution, wall-clock times, rows) is worked out once per step (``layer_rows``). A call
that measures more (statistics, FLOPs, CUDA memory, a torch.profiler range: ``layer_extras``) goes
through ``begin`` and ``end``. Calls made while a graph is traced (torch.compile, torch.jit.trace,
torch.fx) are not measured: they are not executions.

The backward marker notes when the gradient reaches the autograd node that made a call's output (it
never changes the gradient); the first one reached in a backward pass asks the autograd engine to
note when that pass ends (``backward_slices`` needs both). On CPU clocks it is the C++ hook of
``native_marker`` once that is built (a slot per marker, read at the step's end); otherwise, and on
CUDA events, a Python hook on the output tensor, registered the way ``Tensor.register_hook`` does it
but without the removable handle (which costs several times the rest of the call); either lives and
dies with the step's graph.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from comgra.profiling import forward_wrappers, native_marker
from comgra.profiling.layer_extras import Extra, begin_extra, close_scope, end_extra, profiler_enabled, tensors_in

_tracing_state = torch._C._get_tracing_state  # not None inside torch.jit.trace
_is_compiling = torch.compiler.is_compiling  # True while TorchDynamo traces (torch.compile)
# True inside torch.fx.symbolic_trace (older torch: is_fx_tracing, which newer torch makes log a warning)
_is_fx_tracing = getattr(torch.fx._symbolic_trace, "is_fx_symbolic_tracing", None) or torch.fx._symbolic_trace.is_fx_tracing
# Runs a callable once the current backward pass has finished (what DistributedDataParallel uses for its final callback).
_queue_engine_callback = torch.autograd.Variable._execution_engine.queue_callback
_HOOK_KEY = "comgra.backward_reached"  # our key in an output tensor's hook dict (handles use ints: no clash)

# One execution of one module is a list (the cheapest mutable record to make in a call), indexed by:
# SUBTREE_END: the number of records when its forward returned (its nested calls are the records before that).
LAYER, FORWARD_START, FORWARD_END, BYTES, BACKWARD_START, BACKWARD_END, EXTRA, SUBTREE_END = range(8)


class Layer:
    """One profiled module under its dotted name, and the last executions of it (the rows of the layers table)."""

    __slots__ = ("name", "index", "module", "parameter_indices", "open", "history", "needs_input_marks")

    def __init__(self, name: str, index: int, module: torch.nn.Module, history: int, parameter_indices: list[int]):
        self.name = name
        self.index = index  # in the profiler's list of layers
        self.module = module
        self.parameter_indices = parameter_indices  # of every trainable parameter in its subtree
        # A call of a module without parameters ends its backward slice when its inputs' gradient is complete
        # (markers on every input cost more, so a module with parameters has none: see backward_slices).
        self.needs_input_marks = not parameter_indices
        self.open: list[list[Any]] = []  # forward calls in progress under hooks (recursion-safe)
        # Rows of executions older than the latest flushed table, where that table holds fewer than ``history``.
        self.history: deque[tuple[Any, ...]] = deque(maxlen=history)


class _BackwardReached(partial):  # type: ignore[type-arg]
    """The hook on a module's output: ``reached(records, gradient)``. Marked so that pickling a tensor that
    carries it (torch.save of a module's output) does not warn about a hook it cannot keep."""

    __torch_unserializable__ = True


class CallMarks:
    """The marks of the profiled step in progress: ``records`` is None between profiled steps (the calls
    then go straight through), and after a fault of ours (``error``: profiling stops, training goes on)."""

    lean_default = True  # lean_allowed of a new instance (benchmarks switch it off around a profiler's setup)

    def __init__(self, clock: Callable[[], Any]):
        self.clock = clock
        self.records: list[list[Any]] | None = None
        self.finishes: list[Any] | None = None  # the end of each backward pass of the step
        self.finish_queued = False
        self.extras = False  # statistics, FLOPs or CUDA memory: every call takes begin/end
        self.detail = False
        self.cuda = False
        self.flops: FlopCounterMode | None = None
        self.last_node: Any = None  # the autograd node of the last marker set, and the records sharing it
        self.last_records: list[list[Any]] = []
        self.error: BaseException | None = None
        self.native_allowed = True  # False: Python hooks even where the C++ marker is built (benchmarks, tests)
        self.lean_allowed = self.lean_default  # False: the Python handler measures every call (benchmarks, tests)
        self.native: Any = None  # the C++ marker (native_marker), created once it is built
        self.native_mark: Callable[[torch.Tensor, list[Any]], bool] | None = None  # its mark, read once
        self.native_step = False  # the step in progress marks with it
        self.deferred_ends = False  # this step noted inputs' moments to check against the starts at its end

    def open(self, *, detail: bool, cuda: bool, flops: FlopCounterMode | None) -> None:
        self.detail, self.cuda, self.flops = detail, cuda, flops
        self.extras = detail or cuda or flops is not None
        self.records, self.finishes, self.finish_queued = [], [], False
        self.last_node, self.last_records = None, []
        if self.native is None and self.native_allowed and not cuda:
            self.native = native_marker.marker(BACKWARD_START)  # None until built: this step keeps Python hooks
            self.native_mark = None if self.native is None else self.native.mark
        self.native_step = self.native is not None and self.native_allowed and not cuda
        if self.native_step:
            self.native.open()
            self.deferred_ends = False
        if self.native is not None:  # the C++ handlers measure the plain steps' calls themselves
            self.native.route(self.records, self.native_step and not self.extras)

    def close(self) -> tuple[list[list[Any]] | None, list[Any]]:
        """End the step: its records and backward ends; nothing here keeps its graph alive any longer."""
        records, finishes = self.records, self.finishes
        if self.native is not None and records is not None:  # open() routed them to the C++ handlers; fail() unrouted
            self.native.route(None, False)
        if self.native_step:
            self.native_step = False
            finishes = self._native_marks(records is not None)
        self.records = self.finishes = None
        self.last_node, self.last_records = None, []
        self.flops = None
        return records, finishes or []

    def _native_marks(self, wanted: bool) -> list[Any]:
        """The C++ marker puts its moments into the records' backward starts (as the Python hook sets them); its
        backward ends. Closed even when not ``wanted`` (a failed step)."""
        finishes, error = self.native.close()
        if error and wanted:
            self.fail(RuntimeError(f"the C++ backward marker: {error}"))
            return []
        for record in self.records if self.deferred_ends and self.records else ():  # an input's moment counts
            end = record[BACKWARD_END]
            if end is not None and (record[BACKWARD_START] is None or end < record[BACKWARD_START]):
                record[BACKWARD_END] = None  # only after the call's start (see begin)
        return finishes

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.records = self.finishes = None
        if self.native is not None:
            self.native.route(None, False)

    # -- the forward ---------------------------------------------------------------------------------
    def forward_handler(self, layer: Layer) -> forward_wrappers.Handler:
        """What the class-level wrapper calls for this layer's module: the forward, measured. The usual call of a
        plain profiled step takes the lean path written out here, since it costs time on every module call (and
        where the C++ marker is built, ``lean_handler``'s C++ takes it instead). The wrapper has already passed
        calls made while TorchDynamo traces straight to the forward."""
        marks, full = self, layer.needs_input_marks

        def measured_forward(module: torch.nn.Module, forward: Callable[..., Any], args: tuple[Any, ...],
                             kwargs: dict[str, Any]) -> Any:
            if _tracing_state() is not None or _is_fx_tracing():
                return forward(module, *args, **kwargs)
            records = marks.records
            if records is None:
                return forward(module, *args, **kwargs)
            if full or marks.extras or profiler_enabled():
                return marks.measured_in_full(layer, module, forward, args, kwargs)
            clock = marks.clock
            record = [layer, clock(), None, 0, None, None, None, None]
            records.append(record)
            try:
                output = forward(module, *args, **kwargs)
            finally:
                record[FORWARD_END], record[SUBTREE_END] = clock(), len(records)
            if marks.records is not records:
                return output  # the step ended (or profiling failed) while this forward ran
            try:
                if type(output) is torch.Tensor:
                    if marks.native_step:  # no Python object for the node: the C++ marker reads it
                        record[BYTES] = output.nbytes
                        marks.native_mark(output, record)  # type: ignore[misc]
                    else:
                        record[BYTES], node = output.nbytes, output.grad_fn
                        if node is not None:
                            marks.mark_backward_start(output, node, record)
                else:
                    marks.note_outputs(record, output)
            except Exception as error:  # noqa: BLE001 - a fault of ours never breaks the user's forward
                marks.fail(error)
            return output

        return measured_forward

    def lean_handler(self, layer: Layer, fallback: forward_wrappers.Handler) -> forward_wrappers.Handler | None:
        """The C++ handler for ``layer`` (``native_marker.lean_handler``): the lean path of ``forward_handler`` in
        C++, about 2 us less per module call, with ``fallback`` (this layer's ``forward_handler``) for every call
        it does not measure. None while the C++ marker is not built, and for a layer whose calls mark their inputs."""
        if self.native is None or not self.lean_allowed or layer.needs_input_marks:
            return None
        handler: forward_wrappers.Handler | None = native_marker.lean_handler(
            self.native, layer, fallback, self._other_output, self.fail)
        return handler

    def _other_output(self, record: list[Any], output: Any) -> None:
        """For the C++ handler: an output that is not one plain tensor (a tuple, a subclass, ...)."""
        try:
            self.note_outputs(record, output)
        except Exception as error:  # noqa: BLE001 - a fault of ours never breaks the user's forward
            self.fail(error)

    def measured_in_full(self, layer: Layer, module: torch.nn.Module, forward: Callable[..., Any],
                         args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        record = self.begin(layer, args)
        if record is None:
            return forward(module, *args, **kwargs)
        try:
            output = forward(module, *args, **kwargs)
        except BaseException:
            self.abandon(record)
            raise
        self.end(record, output)
        return output

    def hooks(self, layer: Layer) -> tuple[Callable[..., None], Callable[..., None]]:
        """The fallback where no class-level wrapper can be used: forward hooks (recursion-safe by a stack)."""
        marks = self

        def before_forward(module: torch.nn.Module, inputs: Any) -> None:
            if marks.records is None or _is_compiling() or _tracing_state() is not None or _is_fx_tracing():
                return
            record = marks.begin(layer, inputs)
            if record is not None:
                layer.open.append(record)

        def after_forward(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            if layer.open and marks.records is not None:
                marks.end(layer.open.pop(), output)

        return before_forward, after_forward

    def begin(self, layer: Layer, inputs: Any) -> list[Any] | None:
        """A module's forward starts: a new record with its start time (None: not measured)."""
        records = self.records
        if records is None:
            return None
        try:
            record: list[Any] = [layer, None, None, 0, None, None, None, None]
            records.append(record)
            if self.extras or profiler_enabled():
                record[EXTRA] = begin_extra(layer.name, cuda=self.cuda, flops=self.flops)
            if layer.needs_input_marks:
                # On a step of the C++ marker the starts are known only at the step's end: note every input's
                # moment now, keep those after the start then (``_native_marks``).
                _mark_inputs(record, inputs, self.clock, deferred=self.native_step)
                self.deferred_ends = self.deferred_ends or self.native_step
            record[FORWARD_START] = self.clock()
            return record
        except Exception as error:  # noqa: BLE001 - a fault of ours never breaks the user's forward
            self.fail(error)
            return None

    def end(self, record: list[Any], output: Any) -> None:
        """The forward returned: its end time, the output's bytes, a marker for the start of its backward."""
        try:
            record[FORWARD_END] = self.clock()
            records = self.records
            if records is None:
                return  # the step ended (or profiling failed) while this forward ran
            record[SUBTREE_END] = len(records)
            outputs = self.note_outputs(record, output)
            if record[EXTRA] is not None:
                end_extra(record[EXTRA], outputs, flops=self.flops, detail=self.detail)
        except Exception as error:  # noqa: BLE001
            self.fail(error)

    def note_outputs(self, record: list[Any], output: Any) -> list[torch.Tensor]:
        """The bytes of a module's output tensors, and a marker on the first that has an autograd node."""
        outputs = [output] if isinstance(output, torch.Tensor) else list(tensors_in(output))
        record[BYTES] = sum(t.nbytes for t in outputs)
        first = next((t for t in outputs if t.grad_fn is not None), None)
        if first is not None:
            self.mark_backward_start(first, first.grad_fn, record)
        return outputs

    def abandon(self, record: list[Any]) -> None:
        """The user's forward raised: close a torch.profiler range this record opened; the error goes on."""
        if self.records is not None:
            record[SUBTREE_END] = len(self.records)
        extra: Extra | None = record[EXTRA]
        if extra is not None:
            try:
                close_scope(extra)
            except Exception as error:  # noqa: BLE001
                self.fail(error)

    # -- the backward --------------------------------------------------------------------------------
    def mark_backward_start(self, output: torch.Tensor, node: Any, record: list[Any]) -> None:
        """One output suffices: the gradient reaches a module's outputs together. A parent that returns its
        last child's output (the same node) joins the child's marker instead of setting its own."""
        if self.native_step:
            self.native_mark(output, record)  # type: ignore[misc]  # finds a node marked earlier in this step itself
            return
        if node is self.last_node:
            self.last_records.append(record)
            return
        records: list[list[Any]] = [record]
        hooks: Any = output._backward_hooks
        ours = hooks.get(_HOOK_KEY) if hooks is not None else None
        if ours is not None:  # an earlier call returned this tensor too: it is reached at the same moment
            ours.args[0].append(record)
            records = ours.args[0]
        else:
            _add_tensor_hook(output, _HOOK_KEY, _BackwardReached(self._backward_reached, records))
        self.last_node, self.last_records = node, records

    def _backward_reached(self, records: list[list[Any]], _gradient: Any) -> None:
        """Notes when the gradient reaches a module call's output (returns None: never changes it); the first of
        a backward pass asks the engine to note when that pass ends."""
        moment = self.clock()
        for record in records:
            if record[BACKWARD_START] is None:
                record[BACKWARD_START] = moment
        if not self.finish_queued and self.finishes is not None:
            self.finish_queued = True
            try:
                _queue_engine_callback(self._backward_finished)
            except Exception as error:  # noqa: BLE001 - a fault of ours never breaks the user's backward
                self.fail(error)

    def _backward_finished(self) -> None:
        self.finish_queued = False
        if self.finishes is not None:
            self.finishes.append(self.clock())


def _add_tensor_hook(tensor: torch.Tensor, key: Any, hook: Callable[[Any], None]) -> None:
    """``tensor.register_hook(hook)`` without its RemovableHandle (which costs several times the rest of a module
    call): the hook runs when the gradient reaches the autograd node that made the tensor, and goes with the
    step's graph. A tensor whose hooks dict exists (it is registered on its node) gets one more entry."""
    hooks: Any = tensor._backward_hooks
    if hooks is not None:
        hooks[key] = hook
    elif type(tensor) is not torch.Tensor:  # a subclass may dispatch register_hook (__torch_function__)
        tensor.register_hook(hook)
    else:
        hooks = tensor._backward_hooks = OrderedDict()  # weakly referenced by the handles others may add
        hooks[key] = hook
        node: Any = tensor.grad_fn  # not None: the caller checked
        node._register_hook_dict(tensor)


def _input_gradient_done(record: list[Any], clock: Callable[[], Any], _gradient: Any) -> None:
    if record[BACKWARD_START] is not None:
        record[BACKWARD_END] = clock()


def _input_gradient_noted(record: list[Any], clock: Callable[[], Any], _gradient: Any) -> None:
    record[BACKWARD_END] = clock()  # the latest wins, as above; one before the start is dropped at the step's end


def _mark_inputs(record: list[Any], inputs: Any, clock: Callable[[], Any], *, deferred: bool = False) -> None:
    hook = _input_gradient_noted if deferred else _input_gradient_done
    for tensor in tensors_in(inputs):
        if tensor.grad_fn is not None:  # runs once the input's gradient is complete
            _add_tensor_hook(tensor, ("comgra.input_done", id(record)), _BackwardReached(hook, record, clock))

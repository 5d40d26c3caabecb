"""Per-layer profiling of the modules given to ``track_module(name, module, profile=True)``.

Every submodule is measured under its dotted name (``net.b1.attn``) on every training step (or every
``every``-th, see ``ProfileOptions``):
forward and backward time, the bytes of its outputs (and, on CUDA, allocated memory), and, while a
torch profiler runs, it appears as a ``torch.profiler.record_function`` range named after it, so that
a user's own torch.profiler trace shows the modules. On the steps the recorder records, the
statistics of each module's output and the norm of its parameters' gradients are added; on the steps
asked for, its forward FLOPs (``torch.utils.flop_counter.FlopCounterMode``). Rows go to the
``layers`` table; the last ``history`` executions of each layer stay in memory (``history()``).

The work is split by when it happens: per module call (``layer_calls``: a clock read on each side of
the forward and one hook on its output, nothing else on a plain step; ``layer_extras`` for what some
steps add), per step (here: the step's records are set aside), per flush (``layer_rows``: the
backward attribution and the rows of all the steps since the last flush, in arrays, as one Arrow
table; ``history()`` flushes what it needs). Parameters carry gradient hooks only on the steps the
recorder records (for the gradient norms).

Clocks: ``time.perf_counter`` on CPU. On a GPU a mark is a CUDA event recorded in the hook; a step's
events are read once the last of them has completed (``Event.query``, which never blocks), so the
profiler makes no host synchronisation, neither per module nor per step; statistics come to the
host by non-blocking copies. Only ``take(force=True)`` at the end of a run waits for the last step.

Backward time: a hook notes when the gradient reaches a module call's output (on CPU a C++ hook,
``native_marker``, once built; see ``layer_calls``), and the autograd engine's final callback notes
when the backward pass ends; a call without parameters also notes when
its inputs' gradient is complete. ``backward_slices`` cuts the pass at these moments and gives each
slice to one call, so that a call's backward time is its own slices and those of the calls nested in
it: a parent contains its children, and a module called several times in a step (its parameters'
gradients accumulated once for all its calls) is not counted once per call on top of the others. No
``register_full_backward_hook`` (which breaks training code that modifies a module's output in
place, e.g. ``x += ...``, and puts two extra autograd nodes around every module).
"""
from __future__ import annotations

import re
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pyarrow as pa
import torch
from torch.utils.flop_counter import FlopCounterMode

from comgra.profiling import forward_wrappers
from comgra.profiling.layer_calls import EXTRA, CallMarks, Layer
from comgra.profiling.layer_extras import cuda_event, to_host
from comgra.profiling.layer_rows import FIELDS, LayerRows, StepCapture
from comgra.errors import ConfigError

DEFAULT_HISTORY = 100


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


def profile_options(settings: Any, history: int | None, flops_every: int | None, every: int) -> ProfileOptions:
    """The recorder's profiling options: its constructor arguments first, then comgra.toml's
    ``[history] layer_executions`` and, where it is set (> 0), ``[profiling] flops_every_steps``."""
    configured_flops = settings.profiling.flops_every_steps
    if history is None and settings.history.layer_executions < 1:
        raise ConfigError(f"{settings.source}: history.layer_executions={settings.history.layer_executions!r} must be "
                          f"at least 1 (the executions of each profiled layer kept in memory), e.g. 100.")
    return ProfileOptions(settings.history.layer_executions if history is None else history,
                          flops_every if flops_every is not None or not configured_flops else configured_flops,
                          every)


class Profiler:
    """Hooks on the profiled modules while a recorder is alive; ``close()`` removes every one.

    ``cuda``: use CUDA events as the clock (None: where a profiled module has a CUDA parameter)."""

    def __init__(self, options: ProfileOptions = ProfileOptions(), *, cuda: bool | None = None):
        self.options = options
        self._layers: list[Layer] = []
        self._by_module: dict[int, Layer] = {}
        self._parameter_index: dict[int, int] = {}
        self._parameters: list[torch.Tensor] = []  # by index
        self._handles: list[Any] = []
        self._norm_handles: list[Any] = []  # gradient hooks, on recorded steps only
        self._attached: list[torch.nn.Module] = []  # modules measured by a class-level forward wrapper
        self._python_handlers: dict[int, forward_wrappers.Handler] = {}  # by id of an attached module
        self._lean = False  # the attached modules have the C++ handler where they can (once it is built)
        self._forced_cuda = cuda
        self._cuda = bool(cuda)
        self._marks = CallMarks(cuda_event if self._cuda else time.perf_counter)
        self._step: int | None = None
        self._steps_seen = 0
        self._detail = False
        self._grad_norms: dict[int, torch.Tensor] = {}
        self._flops: FlopCounterMode | None = None
        self._flops_counted = False
        self.unmeasured_steps = 0  # profiled steps on which no module call was measured (a compiled model)
        self._step_start: Any = None
        self._step_host = 0.0
        self._epoch = (time.time(), time.perf_counter())  # maps perf_counter onto the wall clock
        self._pending: deque[StepCapture] = deque()  # steps whose rows are not made yet
        self._pending_calls = 0
        self._rows = LayerRows("cuda_event" if self._cuda else "perf_counter")
        self._tables: list[pa.Table] = []  # made, not taken yet
        self._since = 0.0  # when the oldest step not taken yet ended

    @property
    def error(self) -> BaseException | None:
        """A fault inside a hook: profiling stops, training goes on."""
        return self._marks.error

    @property
    def _records(self) -> list[list[Any]] | None:  # the records of the step in progress (None: not profiled)
        return self._marks.records

    # -- setup ------------------------------------------------------------------------------
    def add(self, root_name: str, module: torch.nn.Module) -> None:
        """Profile ``module`` and each of its submodules, named ``root_name.child.grandchild``."""
        for dotted, submodule in module.named_modules():
            if id(submodule) in self._by_module:
                continue  # a module reached twice is profiled once, under its first name
            indices = [self._watch_parameter(p) for p in submodule.parameters() if p.requires_grad]
            layer = Layer(f"{root_name}.{dotted}" if dotted else root_name, len(self._layers), submodule,
                          self.options.history, indices)
            self._layers.append(layer)
            self._by_module[id(submodule)] = layer
            handler = self._marks.forward_handler(layer)
            if forward_wrappers.attach(submodule, self._marks.lean_handler(layer, handler) or handler):
                self._attached.append(submodule)
                self._python_handlers[id(submodule)] = handler
            else:  # TorchScript, an instance's own forward attribute, ...: hooks (nn.Module's slower call path)
                before, after = self._marks.hooks(layer)
                self._handles.append(submodule.register_forward_pre_hook(before))
                self._handles.append(submodule.register_forward_hook(after))
            if self._forced_cuda is None and any(p.is_cuda for p in submodule.parameters(recurse=False)):
                self._cuda, self._marks.clock, self._rows.clock_name = True, cuda_event, "cuda_event"

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
        self._attached, self._python_handlers = [], {}
        self._marks.close()
        self._end_flops()
        self._layers, self._by_module, self._parameter_index, self._parameters = [], {}, {}, []

    @property
    def layer_names(self) -> list[str]:
        return [layer.name for layer in self._layers]

    def history(self, name: str) -> list[dict[str, Any]]:
        """The last ``options.history`` executions of a layer, oldest first (the rows of the layers table)."""
        self._convert_ready(force=False)
        for layer in self._layers:
            if layer.name == name:
                return [dict(zip(FIELDS, row)) for row in self._rows.history(layer)]
        raise ConfigError(f"No profiled layer {name!r}; profiled: {self.layer_names[:12]}")

    # -- one training step --------------------------------------------------------------------
    def start_step(self, training_step: int, *, detail: bool) -> None:
        """``detail``: also activation statistics and gradient norms (the recorder records this step).

        Every ``options.every``-th step is profiled, and every step the recorder records; on the others
        the hooks return at once."""
        self._steps_seen += 1
        self._marks.close()
        self._remove_norm_hooks()
        if self.error is not None or (not detail and (self._steps_seen - 1) % self.options.every):
            return
        self._step, self._detail = training_step, detail
        self._grad_norms = {}
        every, seen = self.options.flops_every, self._steps_seen - 1
        if (every is None and not self._flops_counted) or (every and seen % every == 0):
            self._flops_counted = True
            self._flops = FlopCounterMode(display=False)
            _quiet_about_flop_hooks(True)
            self._flops.__enter__()
        self._step_host = time.perf_counter()
        self._step_start = self._marks.clock()
        self._marks.open(detail=detail, cuda=self._cuda, flops=self._flops)
        if not self._lean and self._marks.native is not None:
            self._use_lean_handlers()
        if detail:  # each gradient's norm when it is complete: before an optimizer may zero it
            self._norm_handles = [parameter.register_post_accumulate_grad_hook(partial(self._parameter_done, index))
                                  for index, parameter in enumerate(self._parameters)]

    def _use_lean_handlers(self) -> None:
        """The C++ marker is built (on a thread, while the first steps ran with Python handlers): from now on the
        attached modules' plain calls are measured in C++ (``CallMarks.lean_handler``)."""
        self._lean = True
        for module in self._attached:
            handler = self._marks.lean_handler(self._by_module[id(module)], self._python_handlers[id(module)])
            if handler is not None:
                forward_wrappers.replace(module, handler)

    def _remove_norm_hooks(self) -> None:
        for handle in self._norm_handles:
            handle.remove()
        self._norm_handles = []

    def finish_step(self, type_of_execution: str | None = None) -> None:
        """Close the step (of ``type_of_execution``, which its rows carry): its marks wait until they can be read,
        its rows then wait for ``take``."""
        records, finishes = self._marks.close()
        self._remove_norm_hooks()
        self._end_flops()
        for layer in self._layers:
            if layer.open:
                layer.open = []  # a forward that raised; nothing of this step outlives it
        if self.error is not None:
            raise self.error  # the recorder reports it once and switches profiling off
        if records is None or self._step is None:
            return
        if not records and self._layers:  # the forward ran inside a compiled graph (torch.compile): nothing to time
            self.unmeasured_steps += 1
        capture = StepCapture(self._step, records, finishes, self._step_start, self._step_host, type_of_execution)
        if self._detail:
            capture.statistics = to_host([(r, r[EXTRA].statistics) for r in records
                                          if r[EXTRA] is not None and r[EXTRA].statistics is not None])
            capture.grad_norms = to_host(list(self._grad_norms.items()))
            self._grad_norms = {}
        capture.drop_records()
        if self._cuda:
            capture.ready = cuda_event()  # after every mark and copy of the step on this stream
        if not self._pending and not self._tables:
            self._since = time.monotonic()
        self._pending.append(capture)
        self._pending_calls += len(records)
        self._step = None

    def abandon_step(self) -> None:
        """Drop the step in progress (an exception interrupted it, ``abandon_step``): none of its marks become rows."""
        self._marks.close()
        self._remove_norm_hooks()
        self._end_flops()
        for layer in self._layers:
            layer.open = []
        self._grad_norms, self._step = {}, None

    def take(self, *, force: bool, max_age: float = 2.0, max_rows: int = 4096) -> pa.Table | None:
        """The rows of the steps since the last take as one table, when there are many or they are ``max_age``
        seconds old (or ``force``): the rows are made then, for all those steps at once."""
        if not (self._pending or self._tables) or not (
                force or self._pending_calls >= max_rows or time.monotonic() - self._since >= max_age):
            return None
        self._convert_ready(force=force)
        tables, self._tables = self._tables, []
        if self._pending:  # CUDA steps the GPU has not reached yet: they wait for the next take
            self._since = time.monotonic()
        return None if not tables else tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    @property
    def counts_flops(self) -> bool:
        """This step counts FLOPs: it must run eagerly (a compiled model runs its Python, module by module).
        TorchDynamo never compiles while a dispatch mode such as the FLOP counter is active: it would skip the
        model's frame for good, and the model would not compile at all."""
        return self._flops is not None

    def _end_flops(self) -> None:
        if self._flops is not None:
            mode, self._flops = self._flops, None
            try:
                mode.__exit__(None, None, None)
            finally:
                _quiet_about_flop_hooks(False)

    def _parameter_done(self, index: int, parameter: torch.Tensor) -> None:
        if self._marks.records is None:
            return
        try:
            if parameter.grad is not None:
                # Now, not at finish_batch: by then an optimizer may have zeroed the gradient. A tensor, no sync.
                self._grad_norms[index] = torch.linalg.vector_norm(parameter.grad.detach().float())
        except Exception as error:  # noqa: BLE001
            self._marks.fail(error)

    # -- turning marks into rows, once per step ----------------------------------------------------
    def _convert_ready(self, *, force: bool) -> None:
        if force and self._pending and self._pending[-1].ready is not None:
            self._pending[-1].ready.synchronize()  # the end of the run; the last step's event comes after all others
        ready = []
        while self._pending:
            capture = self._pending[0]
            if not force and capture.ready is not None and not capture.ready.query():
                break  # the GPU is still busy with that step: read it later, never wait for it
            ready.append(self._pending.popleft())
            self._pending_calls -= capture.calls
        made = self._rows.convert(ready, self._seconds_of) if ready else None
        if made is not None:
            table, layer_ids = made
            self._rows.keep(table, layer_ids, self._layers)
            self._tables.append(table)

    def _seconds_of(self, capture: StepCapture) -> tuple[float | None, Callable[[Any], float | None]]:
        """Marks as seconds on the wall clock (time.time scale): on CPU a fixed offset, on CUDA (offset None) a
        function of the event: its offset from the step's first event, placed at the host time of that event."""
        if not self._cuda:
            return self._epoch[0] - self._epoch[1], _no_seconds
        base = self._epoch[0] + (capture.host_start - self._epoch[1])
        return None, lambda mark: None if mark is None else base + capture.start.elapsed_time(mark) / 1000.0


# The FLOP counter's module tracker puts global module hooks on; torch.compile(module) warns on each call of the
# compiled module that such hooks fire once more for it (theirs: the counts per layer here are unaffected). Quiet
# for the FLOPs step only, from the FLOP counter's start to its end, so that a user's warnings-as-errors holds.
_FLOP_HOOKS_FILTER = ("ignore", re.compile(re.escape("Using `torch.compile(module)` when there are global hooks"), re.I),
                      UserWarning, None, 0)


def _quiet_about_flop_hooks(quiet: bool) -> None:
    filters: Any = warnings.filters
    if quiet and _FLOP_HOOKS_FILTER not in filters:
        filters.insert(0, _FLOP_HOOKS_FILTER)
    elif not quiet and _FLOP_HOOKS_FILTER in filters:
        filters.remove(_FLOP_HOOKS_FILTER)
    getattr(warnings, "_filters_mutated", lambda: None)()  # the cache of decisions made under the old filters


def _no_seconds(mark: Any) -> None:
    raise AssertionError("a CPU mark is turned into seconds by its offset")

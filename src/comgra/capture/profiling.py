"""Per-layer profiling of the modules given to ``track_module(name, module, profile=True)``.

Every submodule is measured under its dotted name (``net.b1.attn``) on every training step (or every
``every``-th, see ``ProfileOptions``):
forward and backward time, the bytes of its outputs (and, on CUDA, allocated memory), and it
appears as a ``torch.profiler.record_function`` range named after it, so that a user's own
torch.profiler trace shows the modules. On the steps the recorder records, the statistics of
each module's output and the norm of its parameters' gradients are added; on the steps asked
for, its forward FLOPs (``torch.utils.flop_counter.FlopCounterMode``). Rows go to the
``layers`` table; the last ``history`` executions of each layer stay in memory (``history()``).

Clocks: ``time.perf_counter`` on CPU. On a GPU a module's time is the time between two CUDA
events recorded in its hooks, read once per step at ``finish_step`` (one synchronisation per
step, none per module), because host time measures only the launch of asynchronous kernels.

Backward time is the span from the moment the gradient reaches a module's outputs to the last
gradient of its parameters or inputs. It needs no ``register_full_backward_hook`` (which breaks
training code that modifies a module's output in place, e.g. ``x += ...``); an input shared
with other modules is complete only when all of them are done, which can lengthen that span.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import torch
from torch.utils.flop_counter import FlopCounterMode

from comgra.errors import ConfigError
from comgra.store import format as fmt

DEFAULT_HISTORY = 100
_profiler_enabled = torch._C._autograd._profiler_enabled  # True while a torch.profiler (or autograd profiler) runs


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


class Execution:
    """One execution of one module in one step (a module called twice has two). Marks are floats
    (perf_counter) or torch.cuda.Event; a plain class with slots, as it is made on every module call."""

    __slots__ = ("call", "forward_start", "forward_end", "backward_start", "backward_end", "output_bytes",
                 "cuda_before", "cuda_allocated_delta", "cuda_peak", "flops_before", "forward_flops",
                 "statistics", "scope")

    def __init__(self, call: int):
        self.call = call
        self.forward_start: Any = None
        self.forward_end: Any = None
        self.backward_start: Any = None
        self.backward_end: Any = None
        self.output_bytes = 0
        self.cuda_before: int | None = None
        self.cuda_allocated_delta: int | None = None
        self.cuda_peak: int | None = None
        self.flops_before: int | None = None
        self.forward_flops: int | None = None
        self.statistics: Any = None  # a tensor [mean, std, abs_max, nan_count] on the output's device
        self.scope: Any = None  # the record_function range, while a torch profiler runs


class _Layer:
    __slots__ = ("name", "module", "parameters", "open", "calls", "history", "needs_input_marks")

    def __init__(self, name: str, module: torch.nn.Module, history: int):
        self.name = name
        self.module = module
        self.parameters = [p for p in module.parameters() if p.requires_grad]
        # The end of a module's backward is its parameters' last gradient; only a module without any
        # needs the gradients of its inputs for it (tensor hooks on every input cost more).
        self.needs_input_marks = not self.parameters
        self.open: list[Execution] = []  # forward calls in progress (recursion-safe)
        self.calls: list[Execution] = []  # this step's executions
        self.history: deque[dict[str, Any]] = deque(maxlen=history)


class Profiler:
    """Hooks on the profiled modules while a recorder is alive; ``close()`` removes every one."""

    def __init__(self, options: ProfileOptions = ProfileOptions()):
        self.options = options
        self._layers: list[_Layer] = []
        self._by_module: dict[int, _Layer] = {}
        self._handles: list[Any] = []
        self._step: int | None = None
        self._steps_seen = 0
        self._detail = False
        self._flops: FlopCounterMode | None = None
        self._cuda = False
        self._step_start: Any = None
        self._step_host = 0.0
        self._epoch = (time.time(), time.perf_counter())  # maps perf_counter onto the wall clock
        self._rows: list[dict[str, Any]] = []
        self._rows_since = 0.0
        self._grad_norms: dict[int, torch.Tensor] = {}
        self._flops_counted = False

    # -- setup ------------------------------------------------------------------------------
    def add(self, root_name: str, module: torch.nn.Module) -> None:
        """Profile ``module`` and each of its submodules, named ``root_name.child.grandchild``."""
        for dotted, submodule in module.named_modules():
            if id(submodule) in self._by_module:
                continue  # a module reached twice is profiled once, under its first name
            layer = _Layer(f"{root_name}.{dotted}" if dotted else root_name, submodule, self.options.history)
            self._layers.append(layer)
            self._by_module[id(submodule)] = layer
            self._handles.append(submodule.register_forward_pre_hook(self._before_forward))
            self._handles.append(submodule.register_forward_hook(self._after_forward))
            self._cuda = self._cuda or any(p.is_cuda for p in submodule.parameters(recurse=False))
        for layer in self._layers:
            for parameter in layer.module.parameters(recurse=False):
                if parameter.requires_grad and not getattr(parameter, "_comgra_profiled", False):
                    parameter._comgra_profiled = True  # type: ignore[attr-defined]
                    self._handles.append(parameter.register_post_accumulate_grad_hook(self._parameter_done))
        self._owners = self._parameter_owners()

    def _parameter_owners(self) -> dict[int, list[_Layer]]:
        """Every layer whose subtree holds a parameter: its gradient ends their backward."""
        owners: dict[int, list[_Layer]] = {}
        for layer in self._layers:
            for parameter in layer.parameters:
                owners.setdefault(id(parameter), []).append(layer)
        return owners

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for layer in self._layers:
            for parameter in layer.module.parameters(recurse=False):
                if getattr(parameter, "_comgra_profiled", False):
                    del parameter._comgra_profiled  # type: ignore[attr-defined]
        self._end_flops()
        self._layers, self._by_module = [], {}

    @property
    def layer_names(self) -> list[str]:
        return [layer.name for layer in self._layers]

    def history(self, name: str) -> list[dict[str, Any]]:
        """The last ``options.history`` executions of a layer, oldest first (the rows of the layers table)."""
        for layer in self._layers:
            if layer.name == name:
                return list(layer.history)
        raise ConfigError(f"No profiled layer {name!r}; profiled: {self.layer_names[:12]}")

    # -- one training step --------------------------------------------------------------------
    def start_step(self, training_step: int, *, detail: bool) -> None:
        """``detail``: also activation statistics and gradient norms (the recorder records this step).

        Every ``options.every``-th step is profiled, and every step the recorder records; on the others
        the hooks return at once."""
        self._steps_seen += 1
        if not detail and (self._steps_seen - 1) % self.options.every:
            return
        self._step, self._detail = training_step, detail
        self._grad_norms = {}
        for layer in self._layers:
            layer.calls, layer.open = [], []
        every, seen = self.options.flops_every, self._steps_seen - 1
        if (every is None and not self._flops_counted) or (every and seen % every == 0):
            self._flops_counted = True
            self._flops = FlopCounterMode(display=False)
            self._flops.__enter__()
        self._step_host = time.perf_counter()
        self._step_start = self._mark()

    def finish_step(self) -> None:
        """Close the step; its rows wait for ``take``."""
        if self._step is None:
            return
        self._end_flops()
        if self._cuda:
            torch.cuda.synchronize()  # once per step: every event of the step can be read now
        norms = self._gradient_norms() if self._detail else {}
        statistics = self._statistics() if self._detail else {}
        rows = []
        for layer in self._layers:
            for execution in layer.calls:
                row = self._row(layer, execution, norms.get(layer.name), statistics.get(id(execution)))
                layer.history.append(row)
                rows.append(row)
            layer.calls, layer.open = [], []  # nothing of this step outlives it
        if rows:
            if not self._rows:
                self._rows_since = time.monotonic()
            self._rows.extend(rows)
        self._step = None

    def take(self, *, force: bool, max_age: float = 2.0, max_rows: int = 4096) -> pa.Table | None:
        """The pending rows as one table, when there are many or they are ``max_age`` seconds old (or
        ``force``): one Arrow conversion per flush, not one per step."""
        if not self._rows or not (force or len(self._rows) >= max_rows
                                  or time.monotonic() - self._rows_since >= max_age):
            return None
        rows, self._rows = self._rows, []
        return pa.Table.from_pylist(rows, schema=fmt.LAYERS_SCHEMA)

    def _end_flops(self) -> None:
        if self._flops is not None:
            mode, self._flops = self._flops, None
            mode.__exit__(None, None, None)

    # -- hooks --------------------------------------------------------------------------------
    def _before_forward(self, module: torch.nn.Module, inputs: Any) -> None:
        layer = self._by_module.get(id(module))
        if layer is None or self._step is None:
            return
        execution = Execution(len(layer.calls))
        layer.calls.append(execution)
        layer.open.append(execution)
        if _profiler_enabled():  # a user's torch.profiler runs: name the range after the module
            execution.scope = torch.profiler.record_function(layer.name)
            execution.scope.__enter__()
        if self._cuda:
            execution.cuda_before = torch.cuda.memory_allocated()
        if self._flops is not None:
            execution.flops_before = self._flops.get_total_flops()
        if layer.needs_input_marks:
            for tensor in _tensors(inputs):
                node = tensor.grad_fn
                if node is not None:  # runs once the input's gradient is complete
                    node.register_prehook(_Marker(self, execution, False))
        execution.forward_start = self._mark()

    def _after_forward(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        layer = self._by_module.get(id(module))
        if layer is None or not layer.open:
            return
        execution = layer.open.pop()
        execution.forward_end = self._mark()
        if execution.scope is not None:
            execution.scope.__exit__(None, None, None)
            execution.scope = None
        outputs = [output] if isinstance(output, torch.Tensor) else list(_tensors(output))
        execution.output_bytes = sum(t.numel() * t.element_size() for t in outputs)
        if self._cuda:
            execution.cuda_allocated_delta = torch.cuda.memory_allocated() - (execution.cuda_before or 0)
            execution.cuda_peak = torch.cuda.max_memory_allocated()
        if self._flops is not None and execution.flops_before is not None:
            execution.forward_flops = self._flops.get_total_flops() - execution.flops_before
        # One output suffices: the gradient reaches a module's outputs together. A prehook on the node that
        # made it runs when that gradient arrives (cheaper than Tensor.register_hook, and never changes it).
        node = next((t.grad_fn for t in outputs if t.grad_fn is not None), None)
        if node is not None:
            node.register_prehook(_Marker(self, execution, True))
        if self._detail:
            first = next((t for t in outputs if t.is_floating_point() and t.numel()), None)
            if first is not None:
                execution.statistics = _statistics_of(first.detach())

    def _parameter_done(self, parameter: torch.Tensor) -> None:
        if self._step is None:
            return
        moment = self._mark()
        if self._detail and parameter.grad is not None:
            # Now, not at finish_batch: by then an optimizer may have zeroed the gradient. A tensor, no sync.
            self._grad_norms[id(parameter)] = torch.linalg.vector_norm(parameter.grad.detach().float())
        for layer in self._owners.get(id(parameter), ()):
            for execution in layer.calls:
                if execution.backward_start is not None:
                    execution.backward_end = moment

    def _mark(self) -> Any:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    # -- turning marks into rows ----------------------------------------------------------------
    def _seconds(self, mark: Any) -> float | None:
        """A mark as seconds on the wall clock (time.time scale)."""
        if mark is None:
            return None
        if isinstance(mark, float):
            return self._epoch[0] + (mark - self._epoch[1])
        # A CUDA event: its offset from the step's first event, placed at the host time of that event.
        return self._epoch[0] + (self._step_host - self._epoch[1]) + self._step_start.elapsed_time(mark) / 1000.0

    def _row(self, layer: _Layer, execution: Execution, grad_norm: float | None,
             statistics: list[float] | None) -> dict[str, Any]:
        forward_start, forward_end = self._seconds(execution.forward_start), self._seconds(execution.forward_end)
        backward_start, backward_end = self._seconds(execution.backward_start), self._seconds(execution.backward_end)
        backward_time = None
        if backward_start is not None and backward_end is not None and backward_end >= backward_start:
            backward_time = backward_end - backward_start
        mean, std, abs_max, nans = statistics if statistics is not None else (None, None, None, None)
        return {
            "training_step": self._step, "module": layer.name, "call": execution.call,
            "clock": "cuda_event" if self._cuda else "perf_counter",
            "forward_start": forward_start,
            "forward_time": None if forward_start is None or forward_end is None else forward_end - forward_start,
            "backward_start": backward_start if backward_time is not None else None, "backward_time": backward_time,
            "output_bytes": execution.output_bytes, "cuda_allocated_delta": execution.cuda_allocated_delta,
            "cuda_peak": execution.cuda_peak, "forward_flops": execution.forward_flops,
            "act_mean": mean, "act_std": std, "act_abs_max": abs_max,
            "act_nan_count": None if nans is None else int(nans), "grad_norm": grad_norm,
        }

    def _statistics(self) -> dict[int, list[float]]:
        """Every output's statistics of the step in one host transfer per device."""
        executions = [e for layer in self._layers for e in layer.calls if e.statistics is not None]
        by_device: dict[Any, list[Execution]] = {}
        for execution in executions:
            by_device.setdefault(execution.statistics.device, []).append(execution)
        result = {}
        for group in by_device.values():
            values = torch.stack([e.statistics for e in group]).tolist()
            result.update({id(e): v for e, v in zip(group, values)})
        return result

    def _gradient_norms(self) -> dict[str, float]:
        """L2 norm of the gradients of each layer's parameters: one norm per parameter (taken when its
        gradient was complete), one transfer, then per layer the root of the sum of squares."""
        taken, self._grad_norms = self._grad_norms, {}
        if not taken:
            return {}
        ids = list(taken)
        device = taken[ids[0]].device
        norms = dict(zip(ids, torch.stack([taken[i].to(device) for i in ids]).tolist()))
        result = {}
        for layer in self._layers:
            squares = [norms[id(p)] ** 2 for p in layer.parameters if id(p) in norms]
            if squares:
                result[layer.name] = float(sum(squares) ** 0.5)
        return result


class _Marker:
    """A grad_fn prehook that notes when a gradient passes; it returns None, so it never changes it."""

    __slots__ = ("profiler", "execution", "start")

    def __init__(self, profiler: Profiler, execution: Execution, start: bool):
        self.profiler, self.execution, self.start = profiler, execution, start

    def __call__(self, _gradients: Any) -> None:
        if self.profiler._step is None:
            return
        if self.start:
            if self.execution.backward_start is None:
                self.execution.backward_start = self.profiler._mark()
        elif self.execution.backward_start is not None:
            self.execution.backward_end = self.profiler._mark()


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

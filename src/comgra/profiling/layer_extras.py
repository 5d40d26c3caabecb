"""What only some profiled steps measure per module call: CUDA memory, FLOPs, output statistics, and the
``torch.profiler.record_function`` range that names the module in a user's own torch.profiler trace.

A plain CPU step measures none of these, and its calls take the profiler's lean path
(``layer_calls``); a call that needs any of them carries an ``Extra``, begun before its forward and
ended after it. Statistics stay tensors on the output's device until the step's end, where
``to_host`` starts one non-blocking copy per device.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

profiler_enabled = torch._C._autograd._profiler_enabled  # True while a torch.profiler (or autograd profiler) runs


class Extra:
    """The extra measurements of one module call (a field stays None where the step does not measure it)."""

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


NO_EXTRA = Extra()  # what a call of the lean path reports


def begin_extra(name: str, *, cuda: bool, flops: FlopCounterMode | None) -> Extra:
    """Before a module's forward: open its record_function range, read the counters it is measured by."""
    extra = Extra()
    if profiler_enabled():  # a user's torch.profiler runs: name the range after the module
        extra.scope = torch.profiler.record_function(name)
        extra.scope.__enter__()
    if cuda:
        extra.cuda_before = torch.cuda.memory_allocated()  # the caching allocator's counter: no sync
    if flops is not None:
        extra.flops_before = flops.get_total_flops()
    return extra


def end_extra(extra: Extra, outputs: list[torch.Tensor], *, flops: FlopCounterMode | None, detail: bool) -> None:
    """After a module's forward: close its range, take the counters' differences, start its statistics."""
    close_scope(extra)
    if extra.cuda_before is not None:
        extra.cuda_allocated_delta = torch.cuda.memory_allocated() - extra.cuda_before
        extra.cuda_peak = torch.cuda.max_memory_allocated()
    if flops is not None and extra.flops_before is not None:
        extra.forward_flops = flops.get_total_flops() - extra.flops_before
    if detail:
        first = next((t for t in outputs if t.is_floating_point() and t.numel()), None)
        if first is not None:
            extra.statistics = statistics_of(first.detach())


def close_scope(extra: Extra) -> None:
    if extra.scope is not None:
        scope, extra.scope = extra.scope, None
        scope.__exit__(None, None, None)


def statistics_of(tensor: torch.Tensor) -> torch.Tensor:
    """[mean, std, abs_max, nan_count] on the tensor's device: five kernels, no host sync."""
    values = tensor.float()
    std, mean = torch.std_mean(values) if values.numel() > 1 else (values.new_zeros(()), values.mean())
    return torch.stack([mean, std, torch.linalg.vector_norm(values, float("inf")), torch.isnan(values).sum()])


def to_host(items: list[tuple[Any, torch.Tensor]]) -> list[tuple[list[Any], torch.Tensor]]:
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


def cuda_event() -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record()  # queued on the current stream: no sync
    return event


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in a module's inputs or outputs (tensors, tuples, lists, dicts, ModelOutput)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)

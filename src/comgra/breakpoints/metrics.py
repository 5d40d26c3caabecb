"""The reductions behind breakpoint conditions: what the conditions on one target need, in one pass.

A ``MetricPlan`` is built once per target when the breakpoints are loaded (not per step). It groups
the metric names so that one kernel serves several: ``torch.aminmax`` gives ``min``, ``max``,
``abs_max``, ``has_nan`` (NaN propagates through min and max) and, without a NaN, ``has_inf``;
``torch.std_mean`` gives ``mean`` and ``std``. The results are stacked and moved to the host with one
``.tolist()``, and the derived metrics are computed there, on a handful of floats.

    >>> plan = MetricPlan(("abs_max", "has_nan"))
    >>> plan(torch.tensor([1.0, -3.0]))
    {'abs_max': 3.0, 'has_nan': 0.0}
"""
from __future__ import annotations

import math

import torch

__all__ = ["MetricPlan", "tensor_metrics", "tensor_metrics_of_many"]

EXTREMES = frozenset({"min", "max", "abs_max", "has_nan", "has_inf"})
MOMENTS = frozenset({"mean", "std"})


class MetricPlan:
    """The reductions for ``names`` (value metrics of conditions.VALUE_METRICS), as one callable."""

    def __init__(self, names: tuple[str, ...] | list[str] | set[str] | frozenset[str]):
        self.names = tuple(sorted(set(names)))
        wanted = set(self.names)
        self.extremes = bool(wanted & EXTREMES)
        self.std = "std" in wanted
        self.mean = "mean" in wanted and not self.std  # std_mean gives the mean too
        self.abs_mean = "abs_mean" in wanted
        self.norm = "norm" in wanted
        # The slots of the stacked result, in the order __call__ fills them.
        self.slots = (("min", "max") if self.extremes else ()) + (("std", "mean") if self.std else ()) + \
            (("mean",) if self.mean else ()) + (("l1",) if self.abs_mean else ()) + (("norm",) if self.norm else ())

    def __call__(self, tensor: torch.Tensor) -> dict[str, float]:
        if not self.names:
            return {}
        data = tensor.detach()
        if data.is_complex():  # its magnitudes |z|, as the recording has them (never the real part alone)
            data = data.abs()
        if not data.is_floating_point():
            data = data.double()
        count = data.numel()
        if count == 0:
            return {name: math.nan for name in self.names}
        parts = self._reductions(data, count)
        raw = dict(zip(self.slots, parts[0].reshape(1).tolist() if len(parts) == 1 else torch.stack(parts).tolist()))
        return self._metrics(raw, data, count)

    def _reductions(self, data: torch.Tensor, count: int) -> list[torch.Tensor]:
        parts: list[torch.Tensor] = []
        if self.extremes:
            parts.extend(torch.aminmax(data))
        if self.std:
            parts.extend(torch.std_mean(data) if count > 1 else (torch.zeros_like(data.reshape(-1)[0]),
                                                                 data.reshape(-1)[0]))
        if self.mean:
            parts.append(data.mean())
        if self.abs_mean:
            parts.append(torch.linalg.vector_norm(data, 1))  # one kernel, no |t| copy
        if self.norm:
            parts.append(torch.linalg.vector_norm(data))
        return parts

    def _metrics(self, raw: dict[str, float], data: torch.Tensor, count: int) -> dict[str, float]:
        """The metrics the names ask for, from the reduced floats (host side)."""
        values: dict[str, float] = {}
        if self.extremes:
            low, high = raw["min"], raw["max"]
            nan = math.isnan(high)  # aminmax propagates NaN to both results
            values.update(min=low, max=high, has_nan=float(nan),
                          abs_max=math.nan if nan else max(abs(low), abs(high)))
            if "has_inf" in self.names:  # with a NaN, min and max cannot show an inf: ask the tensor (rare)
                values["has_inf"] = float(bool(torch.isinf(data).any())) if nan else \
                    float(math.isinf(low) or math.isinf(high))
        if "mean" in raw:
            values["mean"] = raw["mean"]
        if self.std:
            values["std"] = raw["std"]
        if self.abs_mean:
            values["abs_mean"] = raw["l1"] / count
        if self.norm:
            values["norm"] = raw["norm"]
        return {name: values[name] for name in self.names}


def tensor_metrics(tensor: torch.Tensor, names: tuple[str, ...]) -> dict[str, float]:
    """The named reductions of ``tensor``, computed on its device and moved to the host in one transfer."""
    return MetricPlan(names)(tensor)


def tensor_metrics_of_many(tensors: list[torch.Tensor], names: tuple[str, ...] | MetricPlan) -> dict[str, float]:
    """Metrics of several tensors seen as one (a module's parameter gradients); norm is the global norm."""
    plan = names if isinstance(names, MetricPlan) else MetricPlan(names)
    if len(tensors) == 1:
        return plan(tensors[0])
    return plan(torch.cat([(t.detach().abs() if t.is_complex() else t.detach()).reshape(-1).to(torch.float64)
                           for t in tensors]))

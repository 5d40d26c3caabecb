"""Per-layer profiles as plain data: the slowest layers, a flame graph, a Chrome trace.

Input is the ``layers`` table of a recording as a list of row dicts (see README, store section);
no torch, no figures. Module names are dotted (``net.b1.attn``): the parent of a module is its
name without the last part, which is how the flame graph nests.

Nothing is counted twice: a module's measured time already contains its submodules' time, so a
bar's width is the module's own measured (inclusive) time, summed over its calls, and its *self*
time is that minus its children's. Forward calls nest, so their times add up; a backward time is
already the module call's share of the backward pass, cut so that no moment belongs to two calls
(``comgra.profiling.backward_slices``), so a module called several times in a step (a shared block,
an RNN cell) is not counted once per call on top of the others. A child measured a little longer
than its parent (clock noise, or a child called from outside its parent's forward) widens the
parent to the sum of its children, so that the parent still contains them. A module that calls
itself counts only its calls from outside: the inner calls' time is inside the outer call's.

    >>> rows = [{"module": "net", "forward_time": 3.0, "training_step": 0, "call": 0},
    ...         {"module": "net.a", "forward_time": 1.0, "training_step": 0, "call": 0}]
    >>> [(n.name, n.value, n.self_value) for n in flame_graph(rows)]
    [('net', 3.0, 2.0), ('net.a', 1.0, 1.0)]
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

PHASES = ("forward", "backward")


@dataclass(frozen=True)
class LayerSummary:
    module: str
    calls: int
    total: float  # seconds over every execution in the rows
    mean: float
    min: float
    max: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FlameNode:
    name: str  # the dotted module name (unique)
    label: str  # its last part
    parent: str  # "" for a root
    value: float  # inclusive seconds, >= the sum of its children's values
    self_value: float  # value minus the children's values
    calls: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_phase(phase: str) -> str:
    if phase not in PHASES:
        raise ValueError(f"phase={phase!r} is not one of {list(PHASES)}")
    return phase


def _times(rows: Iterable[Mapping[str, Any]], phase: str) -> dict[str, list[float]]:
    """Per module, its measured times of the phase (rows without a measurement are left out), one per call made
    from outside the module: a call nested in a call of the same module (recursion) is part of that call's time."""
    column = f"{_check_phase(phase)}_time"
    result: dict[str, list[float]] = {}
    for row in _outer_calls(rows):
        value = row.get(column)
        if value is not None and math.isfinite(value):
            result.setdefault(str(row["module"]), []).append(float(value))
    return result


_NESTING_SLACK = 1e-6  # seconds: the rounding of a start on the epoch scale (1.7e9 s) plus a duration


def _outer_calls(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows less those of calls that ran inside another call of the same module in the same step (a module
    calling itself): their time, forward and backward, is already inside the outer call's. Calls of a module
    are numbered in the order they began, so in call order each nested call falls inside the last outer one
    (forward intervals nest strictly); a call without forward times counts as an outer one."""
    rows = list(rows)
    order = sorted(range(len(rows)), key=lambda i: _call_order(rows[i]))
    nested: set[int] = set()
    group: Any = None
    outer_end = -math.inf
    for index in order:
        row = rows[index]
        key = _call_order(row)[:4]
        if key != group:
            group, outer_end = key, -math.inf
        start: Any = row.get("forward_start")
        duration: Any = row.get("forward_time")
        if not (_finite(start) and _finite(duration)):
            continue
        end = start + duration
        if start + _NESTING_SLACK < outer_end and end <= outer_end + _NESTING_SLACK:
            nested.add(index)
        else:
            outer_end = end
    return [row for index, row in enumerate(rows) if index not in nested] if nested else rows


def _call_order(row: Mapping[str, Any]) -> tuple[int, int, str, str, int]:
    """(rank, step, type, module, call): an evaluation sharing a training step's number is a step of its own."""
    step = row.get("training_step")
    return (int(row.get("rank") or 0), -1 if step is None else int(step), str(row.get("type_of_execution") or ""),
            str(row["module"]), int(row.get("call") or 0))


def layer_summary(rows: Iterable[Mapping[str, Any]], phase: str = "forward", *,
                  limit: int | None = None) -> list[LayerSummary]:
    """The layers by total time of ``phase``, slowest first (ties: by name)."""
    summaries = [LayerSummary(module, len(values), sum(values), sum(values) / len(values), min(values), max(values))
                 for module, values in _times(rows, phase).items()]
    summaries.sort(key=lambda s: (-s.total, s.module))
    return summaries if limit is None else summaries[:limit]


def parent_of(module: str, known: set[str]) -> str:
    """The nearest profiled ancestor of a dotted name ("" for none)."""
    parts = module.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        candidate = ".".join(parts[:cut])
        if candidate in known:
            return candidate
    return ""


def flame_graph(rows: Iterable[Mapping[str, Any]], phase: str = "forward") -> list[FlameNode]:
    """Nested total time by module hierarchy, parents before children (sorted by name)."""
    times = _times(rows, phase)
    known = set(times)
    children: dict[str, list[str]] = {}
    for module in known:
        children.setdefault(parent_of(module, known), []).append(module)
    values: dict[str, float] = {}

    def value_of(module: str) -> float:  # post-order: a parent is at least the sum of its children
        if module not in values:
            inner = sum(value_of(child) for child in children.get(module, []))
            values[module] = max(sum(times[module]), inner)
        return values[module]

    nodes = []
    for module in sorted(known):
        inner = sum(value_of(child) for child in children.get(module, []))
        nodes.append(FlameNode(module, module.rsplit(".", 1)[-1], parent_of(module, known), value_of(module),
                               max(0.0, value_of(module) - inner), len(times[module])))
    return nodes


def chrome_trace(rows: Iterable[Mapping[str, Any]], *, trial: str = "") -> dict[str, Any]:
    """The executions as a Chrome trace (the JSON object format), for Perfetto and chrome://tracing.

    Forward calls nest strictly, so they are complete ("X") events on one track per rank. A call's
    backward time is its share of the backward pass, drawn from the moment the gradient reached it;
    the shares of calls that interleave in the autograd engine need not nest, so they are async
    events on a track of their own, which the viewers draw without requiring nesting.
    """
    events: list[dict[str, Any]] = []
    ranks: set[int] = set()
    for index, row in enumerate(rows):
        rank = int(row.get("rank") or 0)
        ranks.add(rank)
        args = {"training_step": row.get("training_step"), "call": row.get("call")}
        if row.get("type_of_execution") is not None:
            args["type_of_execution"] = row["type_of_execution"]
        if row.get("forward_flops") is not None:
            args["forward_flops"] = row["forward_flops"]
        if _finite(row.get("forward_start")) and _finite(row.get("forward_time")):
            events.append({"name": row["module"], "cat": "forward", "ph": "X", "pid": rank, "tid": 1,
                           "ts": row["forward_start"] * 1e6, "dur": row["forward_time"] * 1e6, "args": args})
        if _finite(row.get("backward_start")) and _finite(row.get("backward_time")):
            start = row["backward_start"] * 1e6
            common = {"name": row["module"], "cat": "backward", "id": index, "pid": rank, "tid": 2}
            events.append({**common, "ph": "b", "ts": start, "args": args})
            events.append({**common, "ph": "e", "ts": start + row["backward_time"] * 1e6})
    events.sort(key=lambda e: (e["pid"], e["ts"], -e.get("dur", 0)))  # parents before children at equal starts
    names = [{"name": "process_name", "ph": "M", "pid": r, "tid": 0,
              "args": {"name": f"comgra {trial} rank {r}".replace("  ", " ")}} for r in sorted(ranks)]
    threads = [{"name": "thread_name", "ph": "M", "pid": r, "tid": tid, "args": {"name": label}}
               for r in sorted(ranks) for tid, label in ((1, "forward"), (2, "backward"))]
    return {"traceEvents": names + threads + events, "displayTimeUnit": "ms"}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)

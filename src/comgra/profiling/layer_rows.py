"""Profiled steps turned into rows of the ``layers`` table, many steps at a time, and the history of each layer.

A step's end only sets its records aside (``StepCapture``); they become one Arrow table per flush
(``LayerRows.convert``), column by column with NumPy over all the steps of the flush, so that the
cost per module call is a few array elements rather than a few Python statements. What depends only
on the shape of a step (which layers ran, nested how: each call's enclosing call, its depth, its
call number, its name) is worked out once per shape and kept (``StepShapes``): a training loop runs
few shapes (the tutorial's ten sequence lengths).

Backward attribution (``backward_slices``) in arrays: where no call of a step has an end of its own
(every profiled module has parameters), the time from one moment to the next belongs to the call
whose gradient arrived last (the innermost, at one moment), and a call's time is the sum over its
subtree, a difference of prefix sums. A step with ends (modules without parameters) takes
``backward_slices.attribute`` itself.

The history (``history``: the last executions of each layer) is read from the latest flushed tables,
kept while a layer in the oldest has too few executions in the newer ones; past a bound the rows a
layer still needs are copied out of the oldest table, which is let go.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from comgra.profiling import backward_slices
from comgra.profiling.layer_calls import EXTRA, LAYER, Layer
from comgra.profiling.layer_extras import NO_EXTRA
from comgra.store import format as fmt

_SCHEMA = pa.schema([*fmt.LAYERS_SCHEMA, *fmt.ADDED_COLUMNS["layers"]])  # the rows, with the step's type_of_execution
FIELDS = tuple(_SCHEMA.names)
_KEPT_SHAPES = 256  # shapes remembered; a model whose call pattern never repeats starts afresh past this
_KEPT_ROWS = 16384  # flushed rows kept for the history before the layers that need older rows get them one by one
_FINISH, _START = 0, 2  # event kinds, in backward_slices' order at one moment


class StepCapture:
    """The raw marks of one profiled step, until they can be read (on CPU at the next flush; on CUDA once
    its last event has completed).

    The marks wait as columns (one tuple per field), not as the step's per-call records: a step's records
    are a few dozen lists that would live until the flush, long enough for the garbage collector to move
    them to its oldest generation, whose growth triggers full collections of the whole heap (hundreds of
    milliseconds with torch loaded). Tuples of numbers are not tracked by the collector. The records stay
    only where a step's statistics or extras refer to them (``drop_records``)."""

    __slots__ = ("step", "kind", "records", "columns", "calls", "finishes", "start", "host_start", "statistics",
                 "grad_norms", "ready")

    def __init__(self, step: int, records: list[list[Any]], finishes: list[Any], start: Any, host_start: float,
                 kind: str | None = None):
        self.step, self.finishes = step, finishes  # finishes: the ends of backward passes
        self.kind = kind  # the step's type_of_execution: an evaluation may share a training step's number
        self.records: list[list[Any]] | None = records
        self.columns: tuple[tuple[Any, ...], ...] = tuple(zip(*records))  # LAYER ... SUBTREE_END, one tuple each
        self.calls = len(records)
        self.start, self.host_start = start, host_start
        self.statistics: list[tuple[list[list[Any]], Any]] = []  # (records, host values) per device
        self.grad_norms: list[tuple[list[int], Any]] = []  # (parameter indices, host norms) per device
        self.ready: Any = None  # CUDA: an event recorded after everything of the step

    def drop_records(self) -> None:
        """Let the per-call records go where nothing but the columns is needed (a plain step)."""
        plain = not self.columns or self.columns[EXTRA].count(None) == self.calls
        if plain and not self.statistics and not self.grad_norms:
            self.records = None


class _Shape:
    __slots__ = ("nesting", "depths", "names", "calls", "layer_ids", "ends")

    def __init__(self, layers: Sequence[Layer], subtree_ends: Sequence[int | None]):
        self.nesting = backward_slices.nesting_of(subtree_ends)
        self.depths = self.nesting[1]
        self.ends = [index + 1 if end is None else end for index, end in enumerate(subtree_ends)]
        self.layer_ids = [layer.index for layer in layers]
        self.names = [layer.name for layer in layers]
        counts: dict[Layer, int] = {}
        self.calls = []  # the how-manieth execution of its layer in the step, from 0
        for layer in layers:
            call = counts[layer] = counts.get(layer, -1) + 1
            self.calls.append(call)


class StepShapes:
    """The shape of each kind of step seen: ``of(layers, subtree_ends)``."""

    def __init__(self) -> None:
        self._shapes: dict[tuple[Any, ...], _Shape] = {}

    def of(self, layers: tuple[Layer, ...], subtree_ends: tuple[int | None, ...]) -> _Shape:
        key = (layers, subtree_ends)
        shape = self._shapes.get(key)
        if shape is None:
            if len(self._shapes) >= _KEPT_SHAPES:
                self._shapes.clear()
            shape = self._shapes[key] = _Shape(layers, subtree_ends)
        return shape


# Per capture: (offset, seconds). A CPU mark plus ``offset`` is seconds on the wall clock; on CUDA (offset
# None) ``seconds`` reads an event.
Clock = Callable[[StepCapture], tuple["float | None", Callable[[Any], "float | None"]]]


class _Columns:
    """The steps of one flush, column by column (lists filled by C-level extends, arrays at the end)."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.kinds: list[str | None] = []  # type_of_execution, per row
        self.names: list[str] = []
        self.layer_ids: list[int] = []
        self.calls: list[int] = []
        self.offsets: list[float] = []
        self.forward_starts: list[Any] = []
        self.forward_ends: list[Any] = []
        self.output_bytes: list[int] = []
        self.backward_starts: list[Any] = []
        self.capture_ids: list[int] = []
        self.depths: list[int] = []
        self.ends: list[int] = []  # subtree ends, as indices into the flush
        self.extras: list[list[Any]] = [[] for _ in range(8)]  # cuda_allocated_delta ... grad_norm
        self.finish_times: list[float] = []
        self.finish_ids: list[int] = []
        self.own_attribution: list[tuple[int, list[float | None], list[float | None]]] = []  # base, totals, firsts


class LayerRows:
    """Turns the captures of a flush into one table, and keeps each layer's history."""

    def __init__(self, clock_name: str) -> None:
        self.clock_name = clock_name
        self.shapes = StepShapes()
        self._blocks: deque[tuple[pa.Table, np.ndarray, np.ndarray]] = deque()  # (table, layer ids, counts)

    def convert(self, captures: Iterable[StepCapture], clock: Clock) -> tuple[pa.Table, np.ndarray] | None:
        """The captures' rows as one table, and the index of each row's layer."""
        columns = _Columns()
        for capture_id, capture in enumerate(captures):
            self._add(columns, capture_id, capture, clock)
        if not columns.steps:
            return None
        return _table(columns, self.clock_name), np.array(columns.layer_ids, dtype=np.int64)

    def _add(self, columns: _Columns, capture_id: int, capture: StepCapture, clock: Clock) -> None:
        if not capture.calls:
            return
        layers, forward_starts, forward_ends, output_bytes, backward_starts, backward_ends, extras, subtree_ends = \
            capture.columns
        shape = self.shapes.of(layers, subtree_ends)
        offset, seconds = clock(capture)
        finishes = capture.finishes
        if offset is None:  # CUDA events: seconds on the wall clock, one by one
            forward_starts, forward_ends = tuple(map(seconds, forward_starts)), tuple(map(seconds, forward_ends))
            backward_starts, backward_ends = tuple(map(seconds, backward_starts)), tuple(map(seconds, backward_ends))
            finishes, offset = [moment for moment in map(seconds, finishes) if moment is not None], 0.0
        count, base = capture.calls, len(columns.steps)
        columns.steps += [capture.step] * count
        columns.kinds += [capture.kind] * count
        columns.names += shape.names
        columns.layer_ids += shape.layer_ids
        columns.calls += shape.calls
        columns.offsets += [offset] * count
        columns.forward_starts += forward_starts
        columns.forward_ends += forward_ends
        columns.output_bytes += output_bytes
        columns.backward_starts += backward_starts
        columns.capture_ids += [capture_id] * count
        columns.depths += shape.depths
        columns.ends += [base + end for end in shape.ends]
        columns.finish_times += finishes
        columns.finish_ids += [capture_id] * len(finishes)
        if backward_ends.count(None) != count:  # ends of their own: backward_slices' sweep, in Python
            totals, firsts = backward_slices.attribute(backward_starts, backward_ends, subtree_ends, finishes,
                                                       shape.nesting)
            columns.own_attribution.append((base, totals, firsts))
        for column, values in zip(columns.extras, _extra_columns(capture, extras)):
            column += values

    # -- history ---------------------------------------------------------------------------------------
    def keep(self, table: pa.Table, layer_ids: np.ndarray, layers: Sequence[Layer]) -> None:
        """The newest flushed table joins the history. The oldest kept table is let go once every layer in it has
        as many executions in the newer ones as its history holds; past ``_KEPT_ROWS`` rows it is let go anyway,
        and its rows go to the layers that still need them."""
        counts = np.bincount(layer_ids, minlength=len(layers))
        self._blocks.append((table, layer_ids, counts))
        while len(self._blocks) > 1:
            oldest_table, oldest_ids, oldest_counts = self._blocks[0]
            newer = np.zeros(len(layers), dtype=np.int64)
            for block in list(self._blocks)[1:]:
                block_counts = block[2][:len(layers)]  # a block flushed before a layer first ran counts fewer
                newer[:len(block_counts)] += block_counts
            short = [layer for layer in layers if layer.index < len(oldest_counts) and oldest_counts[layer.index]
                     and newer[layer.index] < (layer.history.maxlen or 0)]
            if short and sum(block[0].num_rows for block in self._blocks) <= _KEPT_ROWS:
                return
            for layer in short:
                layer.history.extend(_rows_of_table(oldest_table.filter(pa.array(oldest_ids == layer.index))))
            self._blocks.popleft()

    def history(self, layer: Layer) -> list[tuple[Any, ...]]:
        """The layer's last executions, oldest first."""
        rows = list(layer.history)
        for table, layer_ids, counts in self._blocks:
            if layer.index < len(counts) and counts[layer.index]:
                rows += _rows_of_table(table.filter(pa.array(layer_ids == layer.index)))
        return rows[-(layer.history.maxlen or len(rows)):]


def _rows_of_table(table: pa.Table) -> list[tuple[Any, ...]]:
    return list(zip(*(column.to_pylist() for column in table.columns)))


def _table(columns: _Columns, clock_name: str) -> pa.Table:
    offsets = np.array(columns.offsets)
    forward_starts = np.array(columns.forward_starts, dtype=float)
    forward_times = np.array(columns.forward_ends, dtype=float) - forward_starts
    totals, firsts = _attribute(columns)
    backward_starts = np.where(np.isnan(totals), np.nan, firsts + offsets)
    count = len(columns.steps)
    arrays = [pa.array(columns.steps, pa.int64()), pa.array(columns.names, pa.string()),
              pa.array(columns.calls, pa.int32()), pa.array([clock_name] * count, pa.string()),
              _floats(forward_starts + offsets), _floats(forward_times), _floats(backward_starts), _floats(totals),
              pa.array(columns.output_bytes, pa.int64())]
    arrays += [pa.array(values, field.type) for values, field in zip(columns.extras, list(fmt.LAYERS_SCHEMA)[9:])]
    arrays.append(pa.array(columns.kinds, pa.string()))
    return pa.Table.from_arrays(arrays, schema=_SCHEMA)


def _floats(values: np.ndarray) -> pa.Array:
    return pa.array(values, pa.float64(), from_pandas=True)  # NaN: not measured (null)


def _attribute(columns: _Columns) -> tuple[np.ndarray, np.ndarray]:
    """Per call: its backward time (NaN where neither it nor a nested call was reached) and the start of its
    first slice, for all the steps of the flush at once (see the module's docstring)."""
    starts = np.array(columns.backward_starts, dtype=float)
    count = len(starts)
    reached = ~np.isnan(starts)
    calls = np.flatnonzero(reached)
    capture_ids = np.array(columns.capture_ids, dtype=np.int64)
    times = np.concatenate([starts[calls], np.array(columns.finish_times, dtype=float)])
    kinds = np.concatenate([np.full(len(calls), _START), np.full(len(columns.finish_times), _FINISH)])
    depths = np.concatenate([np.array(columns.depths, dtype=np.int64)[calls], np.zeros(len(columns.finish_times), np.int64)])
    owners = np.concatenate([calls, np.full(len(columns.finish_times), -1)])
    events = np.concatenate([capture_ids[calls], np.array(columns.finish_ids, dtype=np.int64)])
    order = np.lexsort((owners, depths, kinds, times, events))
    times, owners, events = times[order], owners[order], events[order]
    slices = (events[1:] == events[:-1]) & (owners[:-1] >= 0)  # to the next moment of the same step
    own = np.zeros(count + 1)
    np.add.at(own, owners[:-1][slices], (times[1:] - times[:-1])[slices])
    sums = np.concatenate([[0.0], np.cumsum(own[:count])])
    reached_sums = np.concatenate([[0], np.cumsum(reached)])
    ends, positions = np.array(columns.ends, dtype=np.int64), np.arange(count)
    totals = sums[ends] - sums[positions]
    totals[reached_sums[ends] - reached_sums[positions] == 0] = np.nan
    firsts = starts.copy()
    for index in np.flatnonzero(~reached & ~np.isnan(totals))[::-1]:  # reached only through its nested calls:
        firsts[index] = _earliest_child(firsts, ends, index)  # theirs, inner ones first (they come later)
    for base, own_totals, own_firsts in columns.own_attribution:
        totals[base:base + len(own_totals)] = np.array(own_totals, dtype=float)
        firsts[base:base + len(own_firsts)] = np.array(own_firsts, dtype=float)
    return totals, firsts


def _earliest_child(firsts: np.ndarray, ends: np.ndarray, index: int) -> float:
    """The earliest first moment of the calls directly inside ``index`` (as ``backward_slices.attribute``)."""
    earliest, child = math.nan, index + 1
    while child < ends[index]:
        moment = firsts[child]
        if moment == moment and not earliest <= moment:  # not NaN, and earlier (or the first found)
            earliest = moment
        child = ends[child]
    return float(earliest)


def _extra_columns(capture: StepCapture, extras: Sequence[Any]) -> list[list[Any]]:
    """cuda_allocated_delta ... grad_norm: None on a plain step, else one value per record."""
    count = len(extras)
    if not capture.statistics and not capture.grad_norms and extras.count(None) == count:
        return [[None] * count] * 8
    norms = {i: v for indices, values in capture.grad_norms for i, v in zip(indices, values.tolist())}
    statistics = {id(r): v for group, values in capture.statistics for r, v in zip(group, values.tolist())}
    none4 = (None,) * 4
    columns: list[list[Any]] = [[] for _ in range(8)]
    grad_norms: dict[Layer, float | None] = {}
    for record, extra in zip(capture.records or (), extras):
        extra = extra or NO_EXTRA
        layer = record[LAYER]
        if layer not in grad_norms:
            grad_norms[layer] = _grad_norm(layer, norms)
        mean, std, abs_max, nans = statistics.get(id(record), none4)
        for column, value in zip(columns, (extra.cuda_allocated_delta, extra.cuda_peak, extra.forward_flops,
                                           mean, std, abs_max, None if nans is None else int(nans),
                                           grad_norms[layer])):
            column.append(value)
    return columns


def _grad_norm(layer: Layer, norms: dict[int, float]) -> float | None:
    """The L2 norm of the layer's parameters' gradients: the root of the sum of the squared norms taken when
    each gradient was complete."""
    squares = [norms[i] ** 2 for i in layer.parameter_indices if i in norms]
    return float(sum(squares) ** 0.5) if squares else None

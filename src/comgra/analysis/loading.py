"""A trial's recorded values in the shape the detectors need, read chunk by chunk, once.

Chunks are immutable, so what was taken from one is kept under its name: a scan of a live run
reads only the chunks that appeared since the last scan. Neuron values are kept only for the rows
that a detector looks at neuron by neuron (a few per step), so memory grows with the steps, not
with the width of the network.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from comgra.errors import ComgraError
from comgra.store import format as fmt
from comgra.store import layout
from comgra.store.reader import TrialReader

# type_of_execution: a step is (training_step, type); null in chunks written before the column (see ``row_types``).
KEYS = ["training_step", "kind", "iteration", "node", "role", "tensor_type", "aggregation", "sample", "rank",
        "type_of_execution"]
STATS = list(fmt.STATISTICS)
COLUMNS = KEYS + STATS + ["svd_max", "num_neurons", "neurons", "shape"]
SHAPE_KEYS = ["training_step", "iteration", "node", "role", "tensor_type"]
# A trial of up to this many statistics rows is scanned in memory, whole; a bigger one is streamed node
# group by node group (``comgra.analysis.streaming``), each group holding about this many rows at most.
IN_MEMORY_ROWS = 600_000
# What a scanner keeps of the chunks it read, for the next scan of a live run (least recently used goes).
CACHED_ROWS = 1_200_000
# Called with the number of statistics rows of every table a detector gets (a test's counting hook).
observe_rows: Callable[[int], None] | None = None
# Rows whose neurons a detector needs, and how many of their values it needs (None: all recorded).
SAMPLE_NEURONS = 16  # per-sample values: saturation and correlation hints
SPREAD_NEURONS = 16  # batch std per neuron: collapse


@dataclass
class NeuronRows:
    """Rows (their keys) and their neuron values, one list per row, aligned."""

    keys: pd.DataFrame
    values: pa.ListArray

    def matrix(self, index: np.ndarray) -> np.ndarray:
        """The values of the rows at ``index`` (of one tensor: all of the same length) as a 2-D array."""
        if len(index) == 0:
            return np.zeros((0, 0), dtype=np.float32)
        chosen = self.values.take(pa.array(index))
        flat = pc.list_flatten(chosen).to_numpy(zero_copy_only=False).astype(np.float64)
        width = len(flat) // len(index)
        if width * len(index) != len(flat):  # lengths differ (a tensor whose shape changed): keep the shortest
            width = int(pc.min(pc.list_value_length(chosen)).as_py())
            return np.stack([np.asarray(v[:width], dtype=np.float64) for v in chosen.to_pylist()])
        return flat.reshape(len(index), width)


@dataclass
class _ArrowNeurons:
    keys: pa.Table
    values: pa.ListArray


@dataclass
class ChunkData:
    """What a scan keeps of one chunk: the statistics of every row, neurons of a few kinds of rows."""

    stats: pa.Table
    neurons: dict[str, _ArrowNeurons]  # "abs_max", "sample", "std", "parameter"
    shapes: pa.Table | None = None  # per forward tensor and step: its shape (SHAPE_KEYS + shape)


@dataclass
class TrialData:
    """Everything a scan of one trial looks at."""

    trial: str
    stats: pd.DataFrame
    neurons: dict[str, NeuronRows]
    steps: pd.DataFrame  # training_step, type_of_execution, iteration, graph
    graphs: dict[str, dict[str, Any]]  # hash -> graph document
    problems: list[str] = field(default_factory=list)
    # Where a node's values can be opened, for a table that holds only some of its rows (a streamed scan).
    locator: Any = None
    # A sentence for the findings of a detector that saw a subsample (a streamed scan's correlation hints).
    subsample: str = ""
    # The trial's reader, for detectors that read the small tables themselves (runinfo, sentinels, layers), and
    # what they made of them (``comgra.analysis.evidence_tables``).
    reader: Any = None
    tables: dict[str, Any] = field(default_factory=dict)
    # Per forward tensor and step, its shape as a tuple (SHAPE_KEYS + shape); empty in a streamed scan.
    shapes: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=[*SHAPE_KEYS, "shape"]))


class ChunkCache:
    """Per trial and chunk name, what was taken from that chunk. Thread-safe."""

    def __init__(self, max_rows: int | None = None) -> None:
        self._chunks: OrderedDict[tuple[str, str], ChunkData] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self.max_rows = CACHED_ROWS if max_rows is None else max_rows

    @property
    def rows(self) -> int:
        with self._lock:
            return sum(c.stats.num_rows for c in self._chunks.values())

    def clear(self) -> None:
        """Let go of everything read (the app does once the findings are saved)."""
        with self._lock:
            self._chunks.clear()

    def forget(self, directory: str) -> None:
        """Let go of every chunk of one trial (a scan of a sweep does once the trial's findings are saved)."""
        with self._lock:
            for key in [k for k in self._chunks if k[0] == directory]:
                del self._chunks[key]

    def load(self, trial: TrialReader, progress: Callable[[int], None] | None = None) -> TrialData:
        paths = trial.tensor_chunks()
        parts = []
        for path in paths:
            key = (str(trial.directory), path.name)
            with self._lock:
                cached = self._chunks.get(key)
                if cached is not None:
                    self._chunks.move_to_end(key)
            if cached is None:
                cached = read_chunk(trial, path)
                with self._lock:
                    self._chunks[key] = cached
            parts.append(cached)
            if progress is not None:
                progress(1)
        self._forget_others(str(trial.directory), {p.name for p in paths})
        data = _assemble(trial, parts)
        self._trim()
        return data

    def _trim(self) -> None:
        """Keep at most ``max_rows`` rows: a live run's next scan rereads the oldest chunks, if any went."""
        with self._lock:
            total = sum(c.stats.num_rows for c in self._chunks.values())
            while self._chunks and total > self.max_rows:
                _, dropped = self._chunks.popitem(last=False)
                total -= dropped.stats.num_rows

    def _forget_others(self, directory: str, names: set[str]) -> None:
        """Chunks merged into a bigger one are gone from the listing: let go of their copies."""
        with self._lock:
            for key in [k for k in self._chunks if k[0] == directory and k[1] not in names]:
                del self._chunks[key]


def read_chunk(trial: TrialReader, path: Path) -> ChunkData:
    return chunk_data(trial.read_tensor_chunk(path, COLUMNS))


def chunk_data(table: pa.Table) -> ChunkData:
    # One Arrow chunk per column, not one per row group: the filters below run once, not per row group.
    table = table.combine_chunks()
    shapes = None
    if "shape" in table.column_names:
        one_row = pc.and_(pc.equal(table["kind"], fmt.FORWARD), pc.is_in(table["aggregation"], pa.array(["mean", "none"])))
        shapes = table.filter(one_row).select([*SHAPE_KEYS, "shape"])
        table = table.drop_columns(["shape"])
    return ChunkData(table.drop_columns(["neurons"]), _neuron_frames(table), shapes)


def recorded_rows(trial: TrialReader) -> int:
    """The rows of the trial's tensors chunks, from their Parquet footers (no data read): it decides
    whether a trial is scanned in memory or streamed."""
    import pyarrow.parquet as pq

    total = 0
    for path in trial.tensor_chunks():
        try:
            total += pq.ParquetFile(path).metadata.num_rows
        except Exception:  # noqa: BLE001 - a damaged chunk: the scan lists it when it reads it
            continue
    return total


def categorical_frame(table: pa.Table) -> pd.DataFrame:
    """One conversion per scan: strings become categories (a few distinct names, many rows). The column labels are
    plain Python strings (pandas 3 keeps them Arrow-backed, and every ``frame[name]`` and filter of a frame looked a
    label up through Arrow: about a quarter of a small frame's column access, thousands of times per trial)."""
    columns = {}
    for name in table.column_names:
        column = table[name]
        columns[name] = column.dictionary_encode() if pa.types.is_string(column.type) else column
    return plain_labels(pa.table(columns).to_pandas())


def plain_labels(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its column labels as plain Python strings (see ``categorical_frame``), in place."""
    frame.columns = pd.Index(list(frame.columns), dtype=object)
    return frame


def row_types(frame: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """The type of the step of each row of ``frame`` (training_step, type_of_execution): its own, or where it has none
    (a chunk written before the column, when each number was one step) the steps table's for its number."""
    by_number = steps.drop_duplicates("training_step").set_index("training_step")["type_of_execution"]
    numbered = by_number.reindex(frame["training_step"]).to_numpy(dtype=object)
    if "type_of_execution" not in frame.columns:
        return numbered
    own = np.array(frame["type_of_execution"].astype(object), dtype=object)
    missing = pd.isna(own)
    own[missing] = numbered[missing]
    return own


def as_text(values: pd.Series | pd.Index) -> pd.Series | pd.Index:
    """``values.astype(str)``, the same result, for the names of a scan (node, role, kind): from a categorical,
    one string per category taken by code, not one Python string made per row (a streamed scan turned millions
    of rows of names into strings this way: about a tenth of its time)."""
    if not isinstance(values.dtype, pd.CategoricalDtype):
        return values.astype(str)
    categorical = values.array
    codes = np.asarray(categorical.codes)
    if len(codes) and codes.min() < 0:  # a missing name: astype(str) says "nan", as the categories cannot
        return values.astype(str)
    names = categorical.categories.astype(str).take(codes)
    if isinstance(values, pd.Index):
        return names.rename(values.name)
    return pd.Series(names, index=values.index, name=values.name, copy=False)


def _neuron_frames(table: pa.Table) -> dict[str, _ArrowNeurons]:
    forward = pc.equal(table["kind"], fmt.FORWARD)
    parameter = pc.equal(table["tensor_type"], "parameter")
    non_parameter = pc.invert(parameter)
    wanted = {
        "abs_max": (pc.and_(pc.and_(forward, non_parameter), pc.equal(table["aggregation"], "abs_max")), None),
        "sample": (pc.and_(pc.and_(forward, non_parameter), pc.equal(table["aggregation"], "sample")),
                   SAMPLE_NEURONS),
        "std": (pc.and_(pc.and_(forward, non_parameter), pc.equal(table["aggregation"], "std")), SPREAD_NEURONS),
        "parameter": (pc.and_(forward, parameter), None),
    }
    return {name: _neurons_of(table.filter(mask), limit) for name, (mask, limit) in wanted.items()}


def _neurons_of(table: pa.Table, limit: int | None) -> _ArrowNeurons:
    values = table["neurons"].combine_chunks() if table.num_rows else pa.array([], pa.list_(pa.float32()))
    if limit is not None and len(values):
        values = pc.list_slice(values, 0, limit)
    return _ArrowNeurons(table.select(KEYS), _plain_list(values))


def _plain_list(values: pa.Array) -> pa.ListArray:
    """A list array whose offsets start at 0 (a slice or filter may leave them shifted)."""
    return pa.array(values.to_pylist(), pa.list_(pa.float32())) if values.offset else values.cast(
        pa.list_(pa.float32()))


def _assemble(trial: TrialReader, parts: list[ChunkData]) -> TrialData:
    return assemble(trial_context(trial), parts)


@dataclass
class TrialContext:
    """What a scan of one trial reads besides its tensors: the step index, the graphs, damaged files."""

    trial: str
    steps: pd.DataFrame
    graphs: dict[str, dict[str, Any]]
    known: set[int]
    problems: list[str]
    reader: Any = None


def assemble(context: TrialContext, parts: list[ChunkData]) -> TrialData:
    stats = _concat([p.stats for p in parts], context.known)
    names = ("abs_max", "sample", "std", "parameter")
    neurons = {name: _concat_neurons([p.neurons[name] for p in parts], context.known) for name in names}
    if observe_rows is not None:
        observe_rows(len(stats))
    return TrialData(context.trial, stats, neurons, context.steps, context.graphs, list(context.problems),
                     reader=context.reader,
                     shapes=_concat_shapes([p.shapes for p in parts if p.shapes is not None], context.known))


def trial_context(trial: TrialReader) -> TrialContext:
    steps = trial.steps()
    steps_frame = plain_labels(pd.DataFrame({
        "training_step": steps["training_step"].to_numpy(),
        "type_of_execution": steps["type_of_execution"].to_pylist(),
        "iteration": steps["iteration"].to_numpy(),
        "graph": steps["graph"].to_pylist(),
    }))
    graphs: dict[str, dict[str, Any]] = {}
    unreadable: list[str] = []
    for graph_hash in sorted(dict.fromkeys(steps_frame["graph"])):
        try:
            graphs[graph_hash] = dict(trial.graph(graph_hash))
        except ComgraError as error:  # a damaged graph document: scan the rest, and say which one and what it costs
            unreadable.append(f"graphs/{graph_hash}.json: unreadable, so no finding of the steps it describes names "
                              f"where a problem starts ({error})")
    known = set(steps_frame["training_step"].tolist())
    problems = [f"{layout.chunk_label(Path(p))}: {reason}" for p, reason in trial.problem_reasons().items()]
    return TrialContext(trial.trial_id, steps_frame, graphs, known, problems + unreadable, reader=trial)


def _concat(tables: list[pa.Table], known: set[int]) -> pd.DataFrame:
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return pd.DataFrame({name: pd.Series(dtype=object) for name in KEYS + STATS})
    table = pa.concat_tables(tables)
    # Values of a step the index does not list (a crash between the two writes) are not a step.
    listed = pc.is_in(table["training_step"], pa.array(sorted(known), pa.int64()))
    return categorical_frame(table if pc.all(listed).as_py() is not False else table.filter(listed))


def _concat_shapes(tables: list[pa.Table], known: set[int]) -> pd.DataFrame:
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return pd.DataFrame(columns=[*SHAPE_KEYS, "shape"])
    table = pa.concat_tables(tables)
    table = table.filter(pc.is_in(table["training_step"], pa.array(sorted(known), pa.int64())))
    frame = table.select(SHAPE_KEYS).to_pandas()
    frame["shape"] = [tuple(s) if s is not None else () for s in table["shape"].to_pylist()]
    return frame


def _concat_neurons(parts: list[_ArrowNeurons], known: set[int]) -> NeuronRows:
    parts = [p for p in parts if p.keys.num_rows]
    if not parts:
        return NeuronRows(pd.DataFrame({name: pd.Series(dtype=object) for name in KEYS}),
                          pa.array([], pa.list_(pa.float32())))
    keys = pa.concat_tables([p.keys for p in parts])
    values = pa.concat_arrays([p.values for p in parts])
    keep = pc.is_in(keys["training_step"], pa.array(sorted(known), pa.int64()))
    if pc.all(keep).as_py() is False:
        keys, values = keys.filter(keep), values.filter(keep)
    return NeuronRows(categorical_frame(keys), values)


def return_freed_memory(*, collect: bool = True) -> None:
    """Hand the memory a scan freed back to the system: Arrow's pool and glibc's heap keep freed pages for
    reuse, so without this the process stays as big as its largest scan. ``collect`` first frees what only
    reference cycles still hold (a full garbage collection: about 0.1 s of CPU with the scan's libraries
    loaded, where the trim costs a few milliseconds)."""
    import gc

    from comgra.store.writer import release_unused_memory

    if collect:
        gc.collect()
    release_unused_memory(trim=True)

"""The questions the app asks about a recording, answered from the store as plain data.

The Dash callbacks and the REST API both ask this module, so they never
disagree. Nothing here imports Dash or torch, keeps per-user state, or loads a
whole recording: a view reads the step index (small, cached per immutable
chunk) and the rows of one node at one step.

The central question is :meth:`RecordingService.resolve`: given what the user
asked for (any field may be missing or stale), which selection can be shown,
what are the valid choices around it, and what had to change (``notices``)?

    >>> service = RecordingService("/path/to/root/group")        # doctest: +SKIP
    >>> view = service.resolve({"node_id": "input", "aggregation": "sample:0"})  # doctest: +SKIP
    >>> view.row["mean"], view.notices                           # doctest: +SKIP
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from urllib.parse import parse_qs, urlencode
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from comgra.errors import SelectionError, StoreError, did_you_mean
from comgra.store import format as fmt
from comgra.store.reader import GroupReader, TrialReader
from comgra.store.series_read import ReadCancelled
from comgra.service_live import LiveQuestions
from comgra.service_panels import (  # noqa: F401 - the panels' questions and their answers (samples, compare)
    NEURON, Comparison, NeuronValues, PanelQuestions, SampleColumn, SamplesTable, visualization_selection,
)
from comgra.service_findings import FindingQuestions, finding_link  # noqa: F401 - findings (issue 8)

# The "every type of training step" filter. The recorder refuses types that start with "__", so no user's
# type can be this value (a plain "any" was one: a type named "any" could not be selected on its own).
ANY_TYPE = "__any__"
BATCH_AGGREGATIONS = ("mean", "std", "abs_max")
AGGREGATION_LABELS = {
    "mean": "Mean over the batch",
    "std": "STD over the batch",
    "abs_max": "Max abs over the batch",
    "none": "No batch dimension",
}
PLOT_STATISTICS = fmt.STATISTICS + ("svd_max",)
SERIES_CACHE_SIZE = 64  # answers of statistic_series kept; each is two arrays of one value per step
_log = logging.getLogger("comgra.service")
STEP_CACHE_SIZE = 16  # whole steps kept (all rows of one step of one rank): a click in such a step reads no file
# Recorded steps read along with a step that is not kept (see ``RecordingService.step_rows``): the next
# and previous step buttons then find their step kept.
STEPS_READ_AHEAD = 6
STEPS_READ_BEHIND = 2
# The read-ahead window (the steps of the shown type within STEPS_READ_BEHIND / STEPS_READ_AHEAD of the
# shown one) is read again once fewer than this many of the next steps are kept: one background read per
# few clicks on the step buttons, each well before the user reaches its steps.
STEPS_KEPT_AHEAD = 2


def aggregation_value(aggregation: str, sample: int) -> str:
    """The one-string form of (aggregation, sample) used by selectors: "mean", "sample:3", ..."""
    return f"sample:{sample}" if aggregation == "sample" else aggregation


def parse_aggregation(value: str) -> tuple[str, int]:
    """("sample", k) for "sample:k", else (value, -1); a malformed sample index is -1, never an exception."""
    if isinstance(value, str) and value.startswith("sample:"):
        index = value.split(":", 1)[1]
        return "sample", int(index) if index.isdigit() and len(index) < 10 else -1
    return value, -1


def aggregation_label(value: str, category: str | None = None) -> str:
    aggregation, sample = parse_aggregation(value)
    if aggregation != "sample":
        return AGGREGATION_LABELS.get(aggregation, aggregation)
    return f"Sample {sample} ({category})" if category else f"Sample {sample}"


# The query-string keys of a view's link, in order, and the ``wanted`` key each one sets. The app
# reads them at page load and writes them on every change; findings and the REST API build links with
# :func:`view_link`, so a link is the same whoever makes it.
URL_KEYS = {
    "tab": "tab", "trial": "trial", "type": "type_of_execution", "step": "training_step",
    "iteration": "iteration", "node": "node_id", "role": "role", "kind": "kind",
    "aggregation": "aggregation", "rank": "rank",
}


def view_link(trial: str, *, tab: str = "tensors", type_of_execution: str | None = None,
              training_step: int | None = None, iteration: int | None = None, node_id: str | None = None,
              role: str | None = None, kind: str | None = None, aggregation: str | None = None,
              rank: int | None = None) -> str:
    """The app's relative link (``/?tab=...&trial=...``) that opens this view; None fields are left out.

    >>> view_link("trial_a", training_step=40, node_id="out", aggregation="sample:3")
    '/?tab=tensors&trial=trial_a&step=40&node=out&aggregation=sample%3A3'
    """
    values = {"tab": tab, "trial": trial, "type": type_of_execution, "step": training_step,
              "iteration": iteration, "node": node_id, "role": role, "kind": kind,
              "aggregation": aggregation, "rank": rank}
    return "/?" + urlencode({key: value for key, value in values.items() if value is not None})


def wanted_from_query(query: str | Mapping[str, Any]) -> dict[str, Any]:
    """The ``wanted`` of :meth:`RecordingService.resolve` that a view link asks for (see :func:`view_link`).

    Unknown keys and malformed numbers are dropped (they then mean "the default"); a role
    applies to the node the link names.

    >>> wanted_from_query("?tab=tensors&trial=t&step=40&node=out&role=out&aggregation=sample%3A3")
    {'trial': 't', 'training_step': 40, 'node_id': 'out', 'aggregation': 'sample:3', 'roles': {'out': 'out'}}
    """
    if isinstance(query, str):
        query = {k: v[-1] for k, v in parse_qs(query.lstrip("?")).items()}
    wanted: dict[str, Any] = {}
    for key, field_ in URL_KEYS.items():
        value = query.get(key)
        if not isinstance(value, str) or key in ("tab", "role"):
            continue
        if field_ in _WANTED_INT:
            if value.lstrip("-").isdigit() and len(value) < 19:
                wanted[field_] = int(value)
        else:
            wanted[field_] = value
    role = query.get("role")
    if isinstance(role, str) and "node_id" in wanted:
        wanted["roles"] = {wanted["node_id"].split("*", 1)[0]: role}
    return wanted


class Notice(str):
    """A message for the user; ``about`` names the selector it concerns, so the app shows it beside that one.

    ``about`` is one of NOTICE_TOPICS; a plain ``str`` in ``View.notices`` counts as "general".
    """

    about: str

    def __new__(cls, text: str, about: str = "general") -> Notice:
        notice = super().__new__(cls, text)
        notice.about = about
        return notice


NOTICE_TOPICS = ("general", "trial", "rank", "type", "step", "iteration", "node", "role", "kind", "aggregation")


@dataclass(frozen=True)
class Selection:
    """A selection that exists in the recording: every field is valid for the others."""

    trial: str
    type_of_execution: str  # the filter: ANY_TYPE or one type of training step
    training_step: int
    step_type: str  # the type of the selected step
    iteration: int
    node_id: str  # id in the graph; differs from node for a tensor of an earlier iteration
    node: str
    data_iteration: int  # the iteration under which the node's values are stored
    role: str
    kind: str
    aggregation: str  # "mean", "std", "abs_max", "none" or "sample:<k>"
    rank: int = 0  # the torch.distributed rank whose values are shown

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Choices:
    """The valid values of every selector around a selection."""

    trials: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    iterations: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    aggregations: list[tuple[str, str]] = field(default_factory=list)  # (value, label)
    ranks: list[int] = field(default_factory=list)  # the ranks of a torch.distributed run; [0] for one process


@dataclass
class View:
    """Everything the tensors page shows; ``selection`` is None when nothing can be shown."""

    selection: Selection | None = None
    trial: str | None = None  # the trial shown, also when it has nothing to select
    choices: Choices = field(default_factory=Choices)
    graph: fmt.GraphDocument | None = None
    row: dict[str, Any] | None = None
    notices: list[str] = field(default_factory=list)
    banners: list[str] = field(default_factory=list)
    node_fallback: bool = False  # the wanted node does not exist here; another one is shown


@dataclass(frozen=True)
class Series:
    trial: str
    steps: np.ndarray
    values: np.ndarray
    rank: int | None = None  # set when the lines of several ranks are drawn side by side


class StepIndex:
    """The steps table of a trial as arrays, for lookups by type and step without Python rows."""

    def __init__(self, table: pa.Table, chunks: tuple[str, ...] = ()):
        self.table = table
        self.chunks = chunks  # the steps chunks it was built from: its version
        self.steps = table.column("training_step").to_numpy()
        self.types = np.asarray(table.column("type_of_execution").to_pylist(), dtype=object)
        # Answers kept with the index (it never changes): every click asks them again, and over 12,000
        # steps they cost tens of milliseconds each.
        self._types: list[str] | None = None
        self._steps_of: dict[str, np.ndarray] = {}

    def types_of_execution(self) -> list[str]:
        if self._types is None:
            self._types = sorted(set(self.types.tolist()))
        return list(self._types)

    def steps_of(self, type_of_execution: str) -> np.ndarray:
        steps = self._steps_of.get(type_of_execution)
        if steps is None:
            steps = self.steps if type_of_execution == ANY_TYPE else self.steps[self.types == type_of_execution]
            steps = self._steps_of[type_of_execution] = np.unique(steps)
            steps.flags.writeable = False  # shared by every caller
        return steps

    def rows_of(self, training_step: int) -> list[dict[str, Any]]:
        first, last = np.searchsorted(self.steps, [training_step, training_step + 1])
        return self.table.slice(int(first), int(last - first)).to_pylist()


class KeptStep:
    """All rows of one step, with the positions of each (node, iteration): a node's rows without a scan."""

    def __init__(self, table: pa.Table):
        self.table = table = table.combine_chunks()  # ``take`` across DuckDB's many small batches is slow
        self._positions: dict[tuple[str, int], list[int]] = {}
        for position, key in enumerate(zip(table.column("node").to_pylist(), table.column("iteration").to_pylist())):
            self._positions.setdefault(key, []).append(position)

    def rows(self, node: str, iteration: int) -> list[dict[str, Any]]:
        positions = self._positions.get((node, iteration))
        return self.table.take(positions).to_pylist() if positions else []


def neighbour_steps(index: StepIndex, training_step: int) -> list[int]:
    """The recorded steps read along with ``training_step`` when it is not kept (of any type)."""
    steps = index.steps_of(ANY_TYPE)
    position = int(np.searchsorted(steps, training_step))
    return steps[max(0, position - STEPS_READ_BEHIND):position + STEPS_READ_AHEAD + 1].tolist()


def prefetch_window(index: StepIndex, type_of_execution: str, training_step: int) -> tuple[list[int], list[int]]:
    """(the steps that must be kept around ``training_step``, the steps read when one of them is not).

    Both are steps of ``type_of_execution`` (the step buttons move within it), and the shown step: the
    next ``STEPS_KEPT_AHEAD`` and the previous ``STEPS_READ_BEHIND`` must be kept; when one is not, the
    previous ``STEPS_READ_BEHIND`` and the next ``STEPS_READ_AHEAD`` are read together (a 50x chunk holds a
    step's rows in all of its row groups, so several steps cost about what one does).
    """
    typed = index.steps_of(type_of_execution)
    position = int(np.searchsorted(typed, training_step))
    shown = 1 if position < len(typed) and typed[position] == training_step else 0  # else: between two
    first = max(0, position - STEPS_READ_BEHIND)
    near = typed[first:position + shown + STEPS_KEPT_AHEAD].tolist()
    window = typed[first:position + shown + STEPS_READ_AHEAD].tolist()
    return ([training_step, *near], [training_step, *window])


def _split_by_step(table: pa.Table, steps: list[int]) -> dict[int, pa.Table]:
    """The rows of each step of ``steps`` (an empty table for a step without rows), each its own copy:
    a kept step that is dropped then frees its memory, whatever else is kept."""
    column = table.column("training_step").to_numpy()
    order = np.argsort(column, kind="stable")
    ordered = column[order]
    result = {}
    for step in steps:
        first, last = np.searchsorted(ordered, [step, step + 1])
        result[step] = table.take(pa.array(order[first:last]))
    return result


class _Prefetcher:
    """One background thread that runs the latest request it was given; older ones that have not started
    are dropped (the user has moved on). A failure is logged, never raised: a prefetch is an extra."""

    def __init__(self, run: Any):
        self._run = run
        self._latest: Any = None
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="comgra-prefetch", daemon=True)
        self._thread.start()

    def ask(self, request: Any) -> None:
        with self._wake:
            self._latest = request
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(5)

    def _loop(self) -> None:
        while True:
            with self._wake:
                while self._latest is None and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                request, self._latest = self._latest, None
            try:
                self._run(request)
            except Exception:  # noqa: BLE001 - the step is read when it is asked for, and fails visibly then
                _log.debug("comgra: reading steps ahead failed", exc_info=True)


# -- reads that a click never waits for (issue 7) ------------------------------------------------------
LOW_PRIORITY_NICE = 5  # added to the niceness of the thread that reads whole trials (Linux only)


class ReadSuperseded(Exception):
    """A whole-trial read that had not started when a newer one was asked for: the user has moved on
    (the app keeps what it shows; see ``_LowPriorityReads``)."""


class _LowPriorityReads:
    """One thread, at a lower CPU priority, for the reads that scan every chunk of a trial (the series
    plot of a newly selected tensor: seconds at 50x).

    Such a read ran beside the next click's values, on the same two cores, and made that click wait
    up to a second; at a lower priority the click's few milliseconds of work go first. Only reads that
    no click waits for come here (a click that waited on a low-priority read would wait longer).
    A read still waiting for the thread when a newer one is asked for is dropped (``ReadSuperseded``):
    clicking through nodes faster than their series are read queued one read per click, each holding one
    of the browser's six connections to the app, until the values of a click waited for a free one.
    A running read is told so too (``read(cancelled)``: ``cancelled()`` turns true) and ends at its next
    chunk: at 1,000 nodes x 50x steps a series takes seconds, and clicks a second apart kept this thread
    busy with plots nobody would see.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="comgra-whole-trial-read",
                                        initializer=_lower_this_threads_priority)
        self._worker_ids: set[int] = set()
        self._waiting: list[Future[pa.Table]] = []
        self._asked = 0  # reads asked so far: a read whose number is not the last one is superseded
        self._lock = threading.Lock()

    def run(self, read: Callable[[Callable[[], bool]], pa.Table]) -> pa.Table:
        """``read(cancelled)`` on the thread; ``cancelled()`` is true once a newer read was asked for."""
        if threading.get_ident() in self._worker_ids:  # asked from the worker itself: no deadlock
            return read(_never)
        with self._lock:
            for older in self._waiting:
                older.cancel()  # one that has not started; a running one sees cancelled() and stops
            self._asked += 1
            number = self._asked
            future = self._pool.submit(self._tracked, read, lambda: self._asked != number)
            self._waiting = [future]
        try:
            return future.result()
        except CancelledError:
            raise ReadSuperseded("a newer read was asked for before this one started") from None
        except ReadCancelled:
            raise ReadSuperseded("a newer read was asked for while this one ran") from None

    @property
    def asked(self) -> int:
        """How many reads were asked so far (a read asked later supersedes the ones under way)."""
        return self._asked

    def _tracked(self, read: Callable[[Callable[[], bool]], pa.Table], cancelled: Callable[[], bool]) -> pa.Table:
        self._worker_ids.add(threading.get_ident())
        return read(cancelled)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _never() -> bool:
    return False


def _lower_this_threads_priority() -> None:
    """Make the calling thread yield the CPU to the app's other threads (Linux: threads have their own
    niceness). Elsewhere a thread's priority cannot be lowered alone, and nothing changes."""
    if sys.platform.startswith("linux"):
        try:
            thread = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + LOW_PRIORITY_NICE))
        except OSError:  # a sandbox that forbids it: the read runs at the usual priority
            _log.debug("comgra: could not lower the priority of the whole-trial reads", exc_info=True)


class RecordingService(LiveQuestions, FindingQuestions, PanelQuestions):  # profiling and resources; findings (issue 8)
    """Answers from one group folder. Thread-safe; holds caches only, never a user's state."""

    def __init__(self, path: str | Path):
        self.group = GroupReader(path)
        self._indexes: dict[tuple[str, int | None], tuple[tuple[str, ...], StepIndex]] = {}
        self._series: OrderedDict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._steps: OrderedDict[tuple[Any, ...], KeptStep] = OrderedDict()
        self._reading: dict[tuple[Any, ...], threading.Event] = {}  # steps being read now (see _read_steps)
        self._prefetch: _Prefetcher | None = None
        self._prefetch_asked: tuple[Any, ...] | None = None  # what the prefetcher was last asked about
        self._whole_trial_reads: _LowPriorityReads | None = None  # see statistic_series
        self._series_reading: dict[tuple[Any, ...], Future[tuple[np.ndarray, np.ndarray]]] = {}  # under way
        self._lock = threading.Lock()

    def close(self) -> None:
        """Let go of the store's connections (DuckDB reports those still alive at exit as leaks)."""
        self.close_findings()  # the background scanner takes no new trial (issue 8)
        with self._lock:
            prefetch, self._prefetch = self._prefetch, None
            whole_trial_reads, self._whole_trial_reads = self._whole_trial_reads, None
        if prefetch is not None:
            prefetch.close()
        if whole_trial_reads is not None:
            whole_trial_reads.close()
        self.group.close()
        with self._lock:
            self._indexes.clear()
            self._series.clear()
            self._steps.clear()

    # -- small questions ------------------------------------------------------------------------
    def trials(self) -> list[str]:
        return self.group.trials()

    def data_version(self) -> str:
        """A cheap token that changes whenever a run adds a trial or a chunk; compare, don't parse."""
        parts = []
        for trial_id in self.trials():
            counts = [len(self.group.chunk_names(trial_id, table)) for table in ("steps", "kpis", "notes")]
            parts.append(f"{trial_id}:{counts}")
        return "|".join(parts)

    def trial(self, trial_id: str) -> TrialReader:
        return self.group.trial(trial_id)

    def notes(self, trial_id: str) -> list[str]:
        return self.trial(trial_id).notes()

    def kpis(self, trial_id: str) -> pa.Table:
        return self.trial(trial_id).kpis()

    def modules(self, trial_id: str) -> list[dict[str, Any]]:
        """The tracked module trees with ``total`` (parameters of the subtree) added to every module."""
        return [_with_totals(tree) for tree in self.trial(trial_id).metadata.get("modules") or []]

    def problems(self, trial_id: str) -> list[str]:
        """Messages for a banner: damaged chunks that were skipped, an unreadable trial."""
        try:
            trial = self.trial(trial_id)
        except StoreError as error:
            return [str(error)]
        return [f"Skipped {Path(p).parent.name}/{Path(p).name} of trial {trial_id!r}: {reason}. "
                "The rest of the trial is shown." for p, reason in trial.problem_reasons().items()]

    def ranks(self, trial_id: str) -> list[int]:
        """The ranks that recorded steps of the trial (``[0]`` for a single process, also before anything is
        flushed). Read from the steps chunks' names, as ``step_index`` does on every view: no more listing."""
        names = self.trial(trial_id).chunk_names("steps")
        return sorted({rank for name in names if (rank := fmt.rank_of(name)) is not None}) or [0]

    def step_index(self, trial_id: str, rank: int | None = None) -> StepIndex:
        """The steps table of a trial (of one rank, or of all), rebuilt only when a new steps chunk appears."""
        trial = self.trial(trial_id)
        names = tuple(trial.chunk_names("steps"))
        with self._lock:
            cached = self._indexes.get((trial_id, rank))
            if cached is not None and cached[0] == names:
                return cached[1]
        index = StepIndex(trial.steps(rank), names)
        with self._lock:
            self._indexes[(trial_id, rank)] = (names, index)
        return index

    def statistic_series(self, trial_id: str, selection: Selection, statistic: str,
                         rank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(training steps, values) of one statistic of the selected tensor in one trial, over all steps,
        of ``rank`` (default: the selection's rank).

        This reads every chunk of the trial, so answers are kept (a few, most recent
        first) until a new chunk appears: scrubbing through the steps of one tensor
        asks the same question again and again.
        """
        aggregation, sample = parse_aggregation(selection.aggregation)
        rank = selection.rank if rank is None else rank
        version = self.step_index(trial_id, rank).chunks
        key = (trial_id, len(version), version[-1:], selection.node, selection.role, selection.kind,
               selection.data_iteration, aggregation, sample, statistic, rank)
        with self._lock:
            if key in self._series:
                self._series.move_to_end(key)
                return self._series[key]
            # The same series asked again while it is read (the step buttons right after a node click ask
            # for the node's series at the next step) waits for that read instead of queueing a second one.
            under_way = self._series_reading.get(key)
            if under_way is None:
                mine = self._series_reading[key] = Future()
            asked = self._whole_trial_reads.asked if self._whole_trial_reads is not None else 0
        if under_way is not None:
            return self._joined(under_way, asked, lambda: self.statistic_series(trial_id, selection, statistic, rank))
        return self._series_read(key, mine, lambda cancelled: self.trial(trial_id).series(
            node=selection.node, role=selection.role, kind=selection.kind, iteration=selection.data_iteration,
            aggregation=aggregation, sample=sample, statistic=statistic, rank=rank, cancelled=cancelled))

    def _joined(self, under_way: Future[tuple[np.ndarray, np.ndarray]], asked: int,
                ask_again: Callable[[], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """The answer of a read of the same series already under way (what it raised, it raises)."""
        try:
            return under_way.result()
        except ReadSuperseded:
            # Superseded by a read asked before this question (A, then B, then A again): this is the latest
            # wish, and is read anew. A read asked after it supersedes this question too.
            if self._whole_trial_reads is None or self._whole_trial_reads.asked != asked:
                raise
            return ask_again()

    def _series_read(self, key: tuple[Any, ...], mine: Future[tuple[np.ndarray, np.ndarray]],
                     read: Callable[[Callable[[], bool]], pa.Table]) -> tuple[np.ndarray, np.ndarray]:
        """``read`` on the low-priority thread; its answer kept under ``key`` and given to those who joined."""
        try:
            table = self._low_priority(read)
            answer = (table.column("training_step").to_numpy(),
                      table.column("value").to_numpy(zero_copy_only=False).astype(np.float64))
        except BaseException as error:
            with self._lock:
                self._series_reading.pop(key, None)
            mine.set_exception(error)
            raise
        with self._lock:
            self._series_reading.pop(key, None)
            self._series[key] = answer
            while len(self._series) > SERIES_CACHE_SIZE:
                self._series.popitem(last=False)
        mine.set_result(answer)
        return answer

    def _low_priority(self, read: Callable[[Callable[[], bool]], pa.Table]) -> pa.Table:
        """``read()`` on the service's low-priority thread (see ``_LowPriorityReads``)."""
        with self._lock:
            if self._whole_trial_reads is None:
                self._whole_trial_reads = _LowPriorityReads()
            reads = self._whole_trial_reads
        return reads.run(read)

    def tensor_rows(self, trial_id: str, training_step: int, **filters: Any) -> pa.Table:
        """Rows of one step of one trial, filtered like TrialReader.selection."""
        return self.trial(trial_id).selection(training_step=training_step, **filters)

    # -- the tensors page -----------------------------------------------------------------------------
    def node_summaries(self, trial_id: str, training_step: int, iteration: int, *, kind: str = fmt.FORWARD,
                       rank: int = 0) -> dict[str, dict[str, float | None]]:
        """min / mean / max of every node of one iteration (its first role; the batch mean of a tensor with a
        batch dimension), for the graph's hover cards. One query for the whole step."""
        graph = self.graph_at(trial_id, training_step, iteration, rank)
        table = self.step_rows(trial_id, training_step, rank)  # also what the next clicks in this step read
        # Filtered in Arrow first: at 1,000 nodes a step has thousands of rows, and Python rows cost.
        table = table.filter(pc.and_(pc.equal(table["kind"], kind),
                                     pc.is_in(table["aggregation"], pa.array(["mean", "none"])))).select(
            ["node", "role", "iteration", "aggregation", "min", "mean", "max"])
        wanted_rows: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
        for row in table.to_pylist():
            wanted_rows.setdefault((row["node"], row["role"], row["iteration"]), row)
        summaries: dict[str, dict[str, float | None]] = {}
        for node in graph["nodes"]:
            roles = node.get("roles") or []
            key = (node["node"], roles[0] if roles else None, _data_iteration(node, iteration))
            row = wanted_rows.get(key)
            if row is not None:
                summaries[node["id"]] = {name: row[name] for name in ("min", "mean", "max")}
        return summaries

    def step_rows(self, trial_id: str, training_step: int, rank: int) -> pa.Table:
        """Every row of one step of one rank, kept for the last few steps asked.

        The hover cards ask for the whole step as soon as a step is shown; the node clicks
        that follow in the same step then read their rows from here instead of querying
        the chunk again (a step's rows never change once the step index lists it).
        A step that is not kept is read together with its neighbours (``STEPS_READ_AHEAD``
        and ``STEPS_READ_BEHIND``), which costs about as much as the step alone.
        """
        index = self.step_index(trial_id, rank)
        kept = self._kept_step(trial_id, index, training_step, rank)
        if kept is None:
            self._read_steps(trial_id, index, rank, [training_step, *neighbour_steps(index, training_step)])
            kept = self._kept_step(trial_id, index, training_step, rank)
        if kept is None:  # pushed out by other reads meanwhile (many pages at once): read it alone
            kept = KeptStep(self.tensor_rows(trial_id, training_step, rank=rank))
        return kept.table

    def node_rows(self, trial_id: str, index: StepIndex, training_step: int, *, iteration: int, node: str,
                  rank: int) -> list[dict[str, Any]]:
        """The rows of one node at one step and iteration: from a kept step if there is one (or one being read
        now), else one query."""
        kept = self._kept_step(trial_id, index, training_step, rank, wait=True)
        if kept is None:
            return self.tensor_rows(trial_id, training_step, iteration=iteration, node=node, rank=rank).to_pylist()
        return kept.rows(node, iteration)

    def prefetch_near(self, selection: Selection) -> None:
        """Read the steps around the shown one in the background, unless they are kept already: the
        next click on a step button then reads no file. Returns at once; a newer request replaces an
        older one that has not started."""
        # Node clicks in one step ask again and again: only a new step (or type, trial, rank) wakes the thread.
        where = (selection.trial, selection.rank, selection.type_of_execution, selection.training_step)
        with self._lock:
            if self._prefetch is None:
                self._prefetch = _Prefetcher(self._prefetch_steps)
            prefetch, asked, self._prefetch_asked = self._prefetch, self._prefetch_asked, where
        if asked != where:
            prefetch.ask(selection)

    def _prefetch_steps(self, selection: Selection) -> None:
        """On the prefetcher's thread: the steps of the shown type around the shown one (where the step
        buttons go), in one read, once fewer than ``STEPS_KEPT_AHEAD`` of the next ones are kept."""
        index = self.step_index(selection.trial, selection.rank)
        near, window = prefetch_window(index, selection.type_of_execution, selection.training_step)
        with self._lock:
            if all((selection.trial, s, selection.rank, index.chunks[-1:]) in self._steps for s in near):
                return
        self._read_steps(selection.trial, index, selection.rank, window)

    def _kept_step(self, trial_id: str, index: StepIndex, training_step: int, rank: int, *,
                   wait: bool = False) -> KeptStep | None:
        """The kept rows of a step, or None; with ``wait``, after a read of it that is under way has ended."""
        key = (trial_id, training_step, rank, index.chunks[-1:])
        with self._lock:
            kept, reading = self._steps.get(key), self._reading.get(key)
            if kept is not None:
                self._steps.move_to_end(key)
                return kept
        if wait and reading is not None:
            reading.wait()
            with self._lock:
                return self._steps.get(key)
        return None

    def _read_steps(self, trial_id: str, index: StepIndex, rank: int, steps: list[int]) -> None:
        """Read the rows of ``steps`` that are neither kept nor being read, in one query, and keep them;
        then wait for the reads of the others that are under way (one read per step, however many ask)."""
        version = index.chunks[-1:]
        mine: dict[int, threading.Event] = {}
        others: list[threading.Event] = []
        with self._lock:
            for step in dict.fromkeys(steps):
                key = (trial_id, step, rank, version)
                if key in self._steps:
                    continue
                if key in self._reading:
                    others.append(self._reading[key])
                else:
                    mine[step] = self._reading[key] = threading.Event()
        try:
            if mine:
                table = self.trial(trial_id).steps_selection(list(mine), rank=rank)
                by_step = _split_by_step(table, list(mine))
                with self._lock:
                    for step, rows in by_step.items():
                        self._steps[(trial_id, step, rank, version)] = KeptStep(rows)
                        self._steps.move_to_end((trial_id, step, rank, version))
                    while len(self._steps) > STEP_CACHE_SIZE:
                        self._steps.popitem(last=False)
        finally:
            with self._lock:
                for step, event in mine.items():
                    self._reading.pop((trial_id, step, rank, version), None)
                    event.set()
        for event in others:
            event.wait()

    def resolve(self, wanted: Mapping[str, Any]) -> View:
        """Turn what the user asked for into a selection that exists, saying what had to change.

        ``wanted`` may hold trial, type_of_execution, training_step, iteration, node_id,
        roles ({node: role}), kind and aggregation; a missing key means "the default".
        Moving along the graph happens in the browser (assets/comgra.js), which then asks for a node.
        """
        view = View()
        wanted = clean_wanted(wanted, view)
        view.choices.trials = self.trials()
        trial_id = view.trial = _pick_trial(view, wanted.get("trial"))
        if trial_id is None:
            return view
        try:
            view.choices.ranks = self.ranks(trial_id)
            rank = _pick(view, wanted.get("rank"), view.choices.ranks, view.choices.ranks[0], "rank", "rank")
            index = self.step_index(trial_id, rank)
        except StoreError as error:
            view.banners.append(str(error))
            return view
        if len(index.steps) == 0:
            view.banners.append(f"Trial {trial_id!r} has no recorded steps yet. If a run is writing it, "
                                "they appear here as soon as it flushes.")
        else:
            try:
                self._resolve_step(view, trial_id, index, wanted, rank)
            except StoreError as error:  # a damaged graph or chunk of this step: say so; other steps still work
                view.selection, view.graph, view.row = None, None, None
                view.banners.append(f"{error} Other steps and trials still work.")
        view.banners.extend(self.problems(trial_id))  # after reading, so that damage found now is reported
        return view

    def _resolve_step(self, view: View, trial_id: str, index: StepIndex, wanted: Mapping[str, Any],
                      rank: int) -> None:
        choices = view.choices
        choices.types = [ANY_TYPE, *index.types_of_execution()]
        type_ = _pick(view, wanted.get("type_of_execution"), choices.types, ANY_TYPE, "type of training step", "type")
        choices.steps = index.steps_of(type_).tolist()
        step = _pick_step(view, wanted.get("training_step"), choices.steps, type_)
        rows = index.rows_of(step)
        choices.iterations = [r["iteration"] for r in rows]
        iteration = _pick_iteration(view, wanted.get("iteration"), choices.iterations, step)
        step_row = rows[choices.iterations.index(iteration)]
        graph = self.trial(trial_id).graph(step_row["graph"])
        view.graph = graph
        node = _pick_node(view, graph, wanted.get("node_id"), iteration)
        data_iteration = _data_iteration(node, iteration)
        recorded = self.node_rows(trial_id, index, step, iteration=data_iteration, node=node["node"], rank=rank)
        base = {"trial": trial_id, "type_of_execution": type_, "training_step": step,
                "step_type": step_row["type_of_execution"], "iteration": iteration, "node_id": node["id"],
                "node": node["node"], "data_iteration": data_iteration, "rank": rank}
        _resolve_tensor(view, base, node, recorded, wanted)


# -- what the browser sent: any JSON at all ------------------------------------------------------------
_WANTED_TEXT = ("trial", "type_of_execution", "node_id", "kind", "aggregation")
_WANTED_INT = ("training_step", "iteration", "rank")
_INT_LIMIT = 2**62  # beyond any step or iteration; keeps numpy's int64 arithmetic exact


def clean_wanted(wanted: Any, view: View | None = None) -> dict[str, Any]:
    """``wanted`` with every value of the wrong type dropped (it then means "the default").

    The browser holds the selection state, so it can send anything: a string step, an
    integer of 400 digits, a list for a node. Those are wishes that cannot be met,
    not errors: ``view`` gets one notice that lists the keys that were ignored.
    """
    if not isinstance(wanted, Mapping):
        return {}
    known = (*_WANTED_TEXT, *_WANTED_INT, "roles")
    clean: dict[str, Any] = {k: v for k, v in wanted.items() if isinstance(k, str) and k not in known}
    for key in _WANTED_TEXT:
        if isinstance(wanted.get(key), str):
            clean[key] = wanted[key]
    for key in _WANTED_INT:
        value = wanted.get(key)
        if type(value) is int and abs(value) < _INT_LIMIT:  # noqa: E721 - True is no step
            clean[key] = value
    roles = wanted.get("roles")
    if isinstance(roles, Mapping):
        clean["roles"] = {k: v for k, v in roles.items() if isinstance(k, str) and isinstance(v, str)}
    ignored = sorted(k for k in known if wanted.get(k) is not None and k not in clean)
    if ignored and view is not None:
        view.notices.append(f"Ignored selection values that are not valid: {ignored[:8]}.")
    return clean


# -- resolution, one selector at a time -----------------------------------------------------------------
def _pick(view: View, wanted: Any, valid: list[Any], default: Any, what: str, about: str = "general") -> Any:
    if wanted is None or wanted in valid:
        return default if wanted is None else wanted
    view.notices.append(Notice(f"The {what} {wanted!r} is not recorded here; showing {default!r}.", about))
    return default


def _pick_trial(view: View, wanted: str | None) -> str | None:
    trials = view.choices.trials
    if not trials:
        view.banners.append("This recording has no trials yet. If a run is writing it, "
                            "they appear here as soon as it has written its metadata.")
        return None
    if wanted is not None and wanted not in trials:
        view.notices.append(Notice(f"Trial {wanted!r} is not in this recording; showing {trials[0]!r}.", "trial"))
        wanted = None
    return wanted or trials[0]


def _pick_step(view: View, wanted: int | None, steps: list[int], type_: str) -> int:
    if wanted is None:
        return steps[0]
    if wanted in steps:
        return int(wanted)
    nearest = steps[int(np.argmin(np.abs(np.asarray(steps) - wanted)))]
    kind = "recorded" if type_ == ANY_TYPE else f"a {type_!r} step"
    view.notices.append(Notice(f"Training step {wanted} is not {kind}; showing the nearest one, {nearest}.", "step"))
    return nearest


def _pick_iteration(view: View, wanted: int | None, iterations: list[int], step: int) -> int:
    if wanted is None:
        return iterations[0]
    if wanted in iterations:
        return int(wanted)
    shown = iterations[-1] if wanted > iterations[-1] else iterations[0]
    view.notices.append(Notice(f"Training step {step} has iterations {iterations[0]} to {iterations[-1]}; "
                               f"showing iteration {shown} instead of {wanted}.", "iteration"))
    return shown


def _pick_node(view: View, graph: fmt.GraphDocument, wanted: str | None, iteration: int) -> fmt.GraphNode:
    node = _node_by_id(graph, wanted) if wanted else None
    if node is None and wanted:
        name = wanted.removesuffix("*old")
        node = next((n for n in graph["nodes"] if n["node"] == name), None)
        shown = node or _default_node(graph)
        view.node_fallback = True
        view.notices.append(Notice(f"Node {wanted!r} does not exist in iteration {iteration} of this step; "
                                   f"showing {shown['id']!r}.", "node"))
        return shown
    return node or _default_node(graph)


def _default_node(graph: fmt.GraphDocument) -> fmt.GraphNode:
    ordered = sorted(graph["nodes"], key=lambda n: (n["role"] != "input", n["column"], n["row"]))
    return ordered[0]


def _node_by_id(graph: fmt.GraphDocument, node_id: str | None) -> fmt.GraphNode | None:
    return next((n for n in graph["nodes"] if n["id"] == node_id), None)


def _data_iteration(node: fmt.GraphNode, iteration: int) -> int:
    absolute = node.get("absolute_iteration")
    return int(absolute) if absolute is not None else iteration + int(node.get("iteration_offset") or 0)


def _resolve_tensor(view: View, base: dict[str, Any], node: fmt.GraphNode, rows: list[dict[str, Any]],
                    wanted: Mapping[str, Any]) -> None:
    """Pick role, kind and aggregation among the rows that exist for the node."""
    choices = view.choices
    name = node["node"]
    choices.roles = [r for r in node.get("roles") or [] if any(row["role"] == r for row in rows)]
    choices.roles += sorted({row["role"] for row in rows} - set(choices.roles))
    if not rows:
        choices.roles = list(node.get("roles") or [])
        view.notices.append(f"No values were recorded for {name!r} at step {base['training_step']}, "
                            f"iteration {base['data_iteration']}.")
        view.selection = Selection(**base, role=(choices.roles or [""])[0], kind=fmt.FORWARD, aggregation="none")
        return
    wanted_role = (wanted.get("roles") or {}).get(name)
    role = _pick(view, wanted_role, choices.roles, choices.roles[0], f"role of {name!r}", "role")
    of_role = [r for r in rows if r["role"] == role]
    choices.kinds = sorted({r["kind"] for r in of_role}, key=lambda k: (k != fmt.FORWARD, k))
    kind = _pick_kind(view, wanted.get("kind"), choices.kinds, name, role)
    candidates = [r for r in of_role if r["kind"] == kind]
    choices.aggregations = _aggregation_choices(candidates)
    aggregation = _pick_aggregation(view, wanted.get("aggregation"), [v for v, _ in choices.aggregations], name)
    view.row = next(r for r in candidates if aggregation_value(r["aggregation"], r["sample"]) == aggregation)
    view.selection = Selection(**base, role=role, kind=kind, aggregation=aggregation)


def _pick_kind(view: View, wanted: str | None, kinds: list[str], node: str, role: str) -> str:
    default = fmt.FORWARD if fmt.FORWARD in kinds else kinds[0]
    if wanted is None or wanted in kinds:
        return default if wanted is None else wanted
    view.notices.append(Notice(f"No {wanted!r} values were recorded for {node!r} (role {role!r}), e.g. an input "
                               f"or a frozen parameter; showing {default!r}.", "kind"))
    return default


def _aggregation_choices(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    order = {"mean": 0, "std": 1, "abs_max": 2, "sample": 3, "none": 4}
    ordered = sorted(rows, key=lambda r: (order.get(r["aggregation"], 5), r["sample"]))
    values = {aggregation_value(r["aggregation"], r["sample"]): r.get("category") for r in ordered}
    return [(value, aggregation_label(value, category)) for value, category in values.items()]


def _pick_aggregation(view: View, wanted: str | None, valid: list[str], node: str) -> str:
    default = "mean" if "mean" in valid else valid[0]
    if wanted is None or wanted in valid:
        return default if wanted is None else wanted
    if valid == ["none"]:
        reason = f"{node!r} has no batch dimension"
    else:
        reason = f"{aggregation_label(wanted)} was not recorded for {node!r} at this step"
    view.notices.append(Notice(f"{reason}; showing {aggregation_label(default)!r}.", "aggregation"))
    return default


# -- series across trials -------------------------------------------------------------------------------
def series(service: RecordingService, selection: Selection, statistic: str, *,
           all_ranks: bool = False) -> list[Series]:
    """The statistic of the selected tensor at every recorded step, one entry per trial that has it
    (of the selected rank), or with ``all_ranks`` one entry per trial and rank.

    Steps are limited to the selected type of training step, so that iteration
    numbers mean the same thing along the curve.
    """
    result = []
    for trial_id in service.trials():
        try:
            ranks = service.ranks(trial_id) if all_ranks else [selection.rank]
            for rank in ranks:
                steps, values = service.statistic_series(trial_id, selection, statistic, rank)
                index = service.step_index(trial_id, rank)
                if selection.type_of_execution != ANY_TYPE:
                    keep = np.isin(steps, index.steps_of(selection.type_of_execution))
                    steps, values = steps[keep], values[keep]
                if len(steps):
                    result.append(Series(trial_id, steps, values, rank if all_ranks else None))
        except StoreError:
            continue
    return result


# -- module trees -------------------------------------------------------------
def _with_totals(tree: Mapping[str, Any]) -> dict[str, Any]:
    submodules = [_with_totals(child) for child in tree.get("submodules") or []]
    # A tied parameter (tied_to its first name) is counted once, where it is met first.
    own = sum(int(p.get("numel") or 0) for p in tree.get("parameters") or [] if not p.get("tied_to"))
    return {**tree, "submodules": submodules, "own": own, "total": own + sum(s["total"] for s in submodules)}

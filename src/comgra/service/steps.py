"""Reading the rows of recorded steps, and keeping them: the step index, the kept steps, the read-ahead
and the whole-trial reads that no click waits for.

A click in the app reads the rows of one node at one step. :class:`StepReads` keeps the last few whole
steps (``STEP_CACHE_SIZE``), reads the steps around the shown one in the background
(``prefetch_near``) and runs the reads that scan a whole trial (a tensor's series over all steps) on a
thread of lower priority. No torch, no Dash, no per-user state.

    >>> reads = StepReads(TrialQuestions(GroupReader("/path/to/root/group")))  # doctest: +SKIP
    >>> reads.step_index("trial_a").steps_of(ANY_TYPE)                          # doctest: +SKIP
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from comgra.errors import StoreError
from comgra.service.read_threads import LowPriorityReads, Prefetcher, ReadSuperseded
from comgra.service.selection import ANY_TYPE, Selection, Series, parse_aggregation
from comgra.service.trials import TrialQuestions
from comgra.store.reader import TrialReader

SERIES_CACHE_SIZE = 64  # answers of statistic_series kept; each is two arrays of one value per step
# ... and at most this many bytes of them: a live run's series grow with it (16 bytes a step; 64 answers of a
# 100,000-step run would be 100 MiB), and each new chunk makes new answers (issue 31 item 13).
SERIES_CACHE_BYTES = 32 * 2**20
STEP_CACHE_SIZE = 16  # whole steps kept (all rows of one step of one rank): a click in such a step reads no file
# Recorded steps read along with a step that is not kept (see ``StepReads.step_rows``): the next
# and previous step buttons then find their step kept.
STEPS_READ_AHEAD = 6
STEPS_READ_BEHIND = 2
# The read-ahead window (the steps of the shown type within STEPS_READ_BEHIND / STEPS_READ_AHEAD of the
# shown one) is read again once fewer than this many of the next steps are kept: one background read per
# few clicks on the step buttons, each well before the user reaches its steps.
STEPS_KEPT_AHEAD = 2


class StepIndex:
    """The steps table of a trial as arrays, for lookups by type and step without Python rows."""

    def __init__(self, table: pa.Table, chunks: tuple[str, ...] = ()):
        self.table = table
        self.chunks = chunks  # the steps chunks it was built from: its version
        self.steps = table.column("training_step").to_numpy()
        # Each step's type as a small code into ``names`` (None: a row without one), not a Python string per step:
        # the index grows with a live run, and is built again at each new steps chunk (issue 31 item 13).
        encoded = pc.dictionary_encode(table.column("type_of_execution").combine_chunks())
        self.names: list[str | None] = [*encoded.dictionary.to_pylist(), None]
        self.codes = encoded.indices.fill_null(len(self.names) - 1).to_numpy().astype(np.int32)
        # Answers kept with the index (it never changes): every click asks them again, and over 12,000
        # steps they cost tens of milliseconds each.
        self._types: list[str] | None = None
        self._steps_of: dict[str, np.ndarray] = {}
        self._positions: dict[str, list[tuple[int, str]]] = {}
        self._main: str | None = None

    def types_of_execution(self) -> list[str]:
        if self._types is None:
            self._types = sorted({self.names[code] for code in np.unique(self.codes).tolist()})
        return list(self._types)

    def steps_of(self, type_of_execution: str) -> np.ndarray:
        steps = self._steps_of.get(type_of_execution)
        if steps is None:
            steps = self.steps if type_of_execution == ANY_TYPE else self.steps[self.codes == self._code(type_of_execution)]
            steps = self._steps_of[type_of_execution] = np.unique(steps)
            steps.flags.writeable = False  # shared by every caller
        return steps

    def positions(self, type_of_execution: str) -> list[tuple[int, str]]:
        """The step slider's positions: one per step (number, type) of ``type_of_execution`` (ANY_TYPE: every type),
        by number, and the types that share a number in the order they ran (an evaluation at the Trainer's
        global_step g before training step g)."""
        kept = self._positions.get(type_of_execution)
        if kept is None:
            first: dict[tuple[int, str], float] = {}
            times = self.table.column("wall_time").to_pylist() if "wall_time" in self.table.column_names else []
            for position, (step, code) in enumerate(zip(self.steps.tolist(), self.codes.tolist())):
                kind = self.names[code]
                if type_of_execution in (ANY_TYPE, kind):
                    when = times[position] if position < len(times) and times[position] is not None else 0.0
                    first[(step, kind)] = min(first.get((step, kind), when), when)
            kept = self._positions[type_of_execution] = sorted(first, key=lambda pair: (pair[0], first[pair], pair[1]))
        return list(kept)

    def main_type(self) -> str | None:
        """The type most steps have (the training steps): what a step number that several types share shows
        when no type is asked for."""
        if not len(self.codes):
            return None
        if self._main is None:  # the index never changes: once
            counts: dict[str, int] = {}
            for code, count in zip(*(part.tolist() for part in np.unique(self.codes, return_counts=True))):
                counts[str(self.names[code])] = counts.get(str(self.names[code]), 0) + count
            self._main = max(sorted(counts), key=lambda name: counts[name])
        return self._main

    def types_at(self, training_step: int) -> list[str]:
        """The types of the steps numbered ``training_step`` (an evaluation may share a training step's number)."""
        first, last = np.searchsorted(self.steps, [training_step, training_step + 1])
        return sorted({self.names[code] for code in self.codes[first:last].tolist()})

    def _code(self, type_of_execution: str | None) -> int:
        """The code of a type (-1: none of the index's steps has it)."""
        return self.names.index(type_of_execution) if type_of_execution in self.names else -1

    def rows_of(self, training_step: int, type_of_execution: str | None = None) -> list[dict[str, Any]]:
        """The rows (one per iteration) of one step: of ``type_of_execution`` where several types share the number;
        without one (or ANY_TYPE), of the main type if it has the number, else of the first type that has."""
        first, last = np.searchsorted(self.steps, [training_step, training_step + 1])
        rows = self.table.slice(int(first), int(last - first)).to_pylist()
        types = {r["type_of_execution"] for r in rows}
        if type_of_execution in (None, ANY_TYPE):
            if len(types) < 2:
                return rows
            main = self.main_type()
            type_of_execution = main if main in types else min(types)
        return [r for r in rows if r["type_of_execution"] == type_of_execution]


class KeptStep:
    """All rows of one step, with the positions of each (node, iteration): a node's rows without a scan."""

    def __init__(self, table: pa.Table):
        self.table = table = table.combine_chunks()  # ``take`` across DuckDB's many small batches is slow
        self._positions: dict[tuple[str, int], list[int]] = {}
        for position, key in enumerate(zip(table.column("node").to_pylist(), table.column("iteration").to_pylist())):
            self._positions.setdefault(key, []).append(position)

    def rows(self, node: str, iteration: int, type_of_execution: str | None = None) -> list[dict[str, Any]]:
        """The node's rows; with a type, of that type's step only (rows of chunks older than the type column have
        none, and belong to the one step of their number)."""
        positions = self._positions.get((node, iteration))
        rows = self.table.take(positions).to_pylist() if positions else []
        return rows if type_of_execution is None else of_type(rows, type_of_execution)

    def of_type(self, type_of_execution: str | None) -> pa.Table:
        """Every row of the step of this type (None: all rows of the number)."""
        if type_of_execution is None or "type_of_execution" not in self.table.column_names:
            return self.table
        column = self.table["type_of_execution"]
        return self.table.filter(pc.or_kleene(pc.equal(column, type_of_execution), pc.is_null(column)))


def of_type(rows: list[dict[str, Any]], type_of_execution: str) -> list[dict[str, Any]]:
    """The rows of one step's type; a row without a type (an older chunk) is its number's only step's."""
    return [r for r in rows if r.get("type_of_execution") in (None, type_of_execution)]


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


class StepReads:
    """The step index, kept steps and series of the trials of one group. Thread-safe; caches only."""

    def __init__(self, trials: TrialQuestions):
        self._trials = trials
        self._indexes: dict[tuple[str, int | None], tuple[tuple[str, ...], StepIndex, TrialReader]] = {}
        self._series: OrderedDict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._steps: OrderedDict[tuple[Any, ...], KeptStep] = OrderedDict()
        self._reading: dict[tuple[Any, ...], threading.Event] = {}  # steps being read now (see _read_steps)
        self._prefetch: Prefetcher | None = None
        self._prefetch_asked: tuple[Any, ...] | None = None  # what the prefetcher was last asked about
        self._whole_trial_reads: LowPriorityReads | None = None  # see statistic_series
        self._series_reading: dict[tuple[Any, ...], Future[tuple[np.ndarray, np.ndarray]]] = {}  # under way
        self._lock = threading.Lock()

    def close(self) -> None:
        """Stop the background threads and drop what is kept."""
        with self._lock:
            prefetch, self._prefetch = self._prefetch, None
            whole_trial_reads, self._whole_trial_reads = self._whole_trial_reads, None
        if prefetch is not None:
            prefetch.close()
        if whole_trial_reads is not None:
            whole_trial_reads.close()
        with self._lock:
            self._indexes.clear()
            self._series.clear()
            self._steps.clear()

    def trial(self, trial_id: str) -> TrialReader:
        return self._trials.trial(trial_id)

    def step_index(self, trial_id: str, rank: int | None = None) -> StepIndex:
        """The steps table of a trial (of one rank, or of all), rebuilt only when a new steps chunk appears."""
        trial = self.trial(trial_id)
        names = tuple(trial.chunk_names("steps"))
        with self._lock:
            cached = self._indexes.get((trial_id, rank))
            if cached is not None and cached[2] is not trial:  # a new run took the name: its chunks may have the
                self._forget(trial_id)  # old run's names, so nothing kept of the old run may answer for it
            elif cached is not None and cached[0] == names:
                return cached[1]
        index = StepIndex(trial.steps(rank), names)
        with self._lock:
            self._indexes[(trial_id, rank)] = (names, index, trial)
        return index

    def _forget(self, trial_id: str) -> None:
        """Drop what is kept of a trial (under the lock): its folder was replaced (capture.open_recorders)."""
        for kept in (self._indexes, self._series, self._steps):
            for key in [k for k in kept if k[0] == trial_id]:
                del kept[key]

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
        typed = None if selection.type_of_execution == ANY_TYPE else selection.type_of_execution
        key = (trial_id, len(version), version[-1:], selection.node, selection.role, selection.kind,
               selection.data_iteration, aggregation, sample, statistic, rank, typed)
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
            aggregation=aggregation, sample=sample, statistic=statistic, rank=rank, cancelled=cancelled,
            type_of_execution=typed))

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
            kept = sum(steps.nbytes + values.nbytes for steps, values in self._series.values())
            while len(self._series) > SERIES_CACHE_SIZE or (kept > SERIES_CACHE_BYTES and len(self._series) > 1):
                steps, values = self._series.popitem(last=False)[1]  # the least recently asked
                kept -= steps.nbytes + values.nbytes
        mine.set_result(answer)
        return answer

    def _low_priority(self, read: Callable[[Callable[[], bool]], pa.Table]) -> pa.Table:
        """``read()`` on the service's low-priority thread (see ``LowPriorityReads``)."""
        with self._lock:
            if self._whole_trial_reads is None:
                self._whole_trial_reads = LowPriorityReads()
            reads = self._whole_trial_reads
        return reads.run(read)

    def tensor_rows(self, trial_id: str, training_step: int, **filters: Any) -> pa.Table:
        """Rows of one step of one trial, filtered like TrialReader.selection (``type_of_execution=None``: any)."""
        if filters.get("type_of_execution", "") is None:
            del filters["type_of_execution"]
        return self.trial(trial_id).selection(training_step=training_step, **filters)


    def step_rows(self, trial_id: str, training_step: int, rank: int,
                  type_of_execution: str | None = None) -> pa.Table:
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
        return kept.of_type(type_of_execution)

    def node_rows(self, trial_id: str, index: StepIndex, training_step: int, *, iteration: int, node: str,
                  rank: int, type_of_execution: str | None = None) -> list[dict[str, Any]]:
        """The rows of one node at one step (of ``type_of_execution``, where given) and iteration: from a kept step
        if there is one (or one being read now), else one query."""
        kept = self._kept_step(trial_id, index, training_step, rank, wait=True)
        if kept is None:
            return self.tensor_rows(trial_id, training_step, iteration=iteration, node=node, rank=rank,
                                    type_of_execution=type_of_execution).to_pylist()
        return kept.rows(node, iteration, type_of_execution)

    def prefetch_near(self, selection: Selection) -> None:
        """Read the steps around the shown one in the background, unless they are kept already: the
        next click on a step button then reads no file. Returns at once; a newer request replaces an
        older one that has not started."""
        # Node clicks in one step ask again and again: only a new step (or type, trial, rank) wakes the thread.
        where = (selection.trial, selection.rank, selection.type_of_execution, selection.training_step)
        with self._lock:
            if self._prefetch is None:
                self._prefetch = Prefetcher(self._prefetch_steps)
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


class SeriesSource(Protocol):
    """What :func:`series` asks: :class:`StepReads` or the service that composes it."""

    def trials(self) -> list[str]: ...
    def ranks(self, trial_id: str) -> list[int]: ...
    def step_index(self, trial_id: str, rank: int | None = None) -> StepIndex: ...
    def statistic_series(self, trial_id: str, selection: Selection, statistic: str,
                         rank: int | None = None) -> tuple[np.ndarray, np.ndarray]: ...


# -- series across trials -------------------------------------------------------------------------------
def series(service: SeriesSource, selection: Selection, statistic: str, *,
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

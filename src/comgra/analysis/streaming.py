"""The scan of a trial too big to hold in memory: each chunk read once, the rows split by node group.

A trial of more than ``loading.IN_MEMORY_ROWS`` statistics rows is not loaded whole. Its chunks are
read one at a time and their rows written, by node group and window of steps, to temporary Arrow
files; then each group is read back a batch of windows (about ``GROUP_ROWS`` rows) at a time, and the
detectors that judge a node by itself (dead, saturated and one-sided units, collapse, parameters,
outliers, growth) keep of each batch only what they judge by: per unit, whether it was ever non-zero
or how often it sat at a bound; per step, a few numbers (the extremes, the median spread, the
statistics the outlier and growth detectors follow); per parameter, the size of each update. These
merge window after window and give exactly the findings of a scan in memory. What the other
detectors need from every node is gathered small on the way:

- non-finite values: the rows of the first step with a NaN or an infinity of each kind, and for
  every later step only which nodes had one;
- gradients: one number per node and step (the log of its largest mean absolute gradient);
- growth: the candidates of each group, and each series' value at its last step;
- outliers: the ``outliers.MAX_FINDINGS`` strongest candidates so far;
- correlation hints: the per-sample rows of an evenly spaced subsample of the steps, at most about
  ``CORRELATION_ROWS`` rows of all tensors together; each hint says so.

The rows held at once are bounded by a batch of windows, whatever the number of steps; what grows
with the steps is a few numbers per node and step (the per-step series above, the gradients' summary
and where each node's steps can be opened), and the time is linear in the rows.
"""
from __future__ import annotations

import math
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from comgra.analysis import (cooccurrence, correlation, evidence_detectors, graphs, loading, nonfinite, outliers,
                             parameters, trends, units, updates)
from comgra.analysis.detectors import explained, learning_of, paces_of
from comgra.analysis.findings import Finding, ScanOptions, rank_findings
from comgra.analysis.loading import KEYS, STATS, TrialContext, TrialData
from comgra.errors import SelectionError
from comgra.store import format as fmt
from comgra.store import layout
from comgra.store.reader import TrialReader

GROUP_ROWS = 250_000
# Between node groups the heap is trimmed; cycles are collected only every this many groups: a full collection
# costs about 0.1 s of CPU, and at one per group it was 7-10% of a streamed scan. The rows of a group are freed
# by reference counting, not by the collector, so the peak memory stays the same (checked at 192 nodes x 50x).
COLLECT_EVERY_GROUPS = 16
_ONE_AT_A_TIME = threading.Lock()
BATCH_ROWS = 100_000  # rows of a chunk read at once
# The columns a scan reads, as the store writes them: every part of every chunk is written in this shape.
_SPILLED = pa.schema([fmt.SCHEMAS["tensors"].field(name) for name in loading.COLUMNS])
CORRELATION_ROWS: int | None = None  # per-sample rows of every tensor together (None: GROUP_ROWS)


@dataclass
class Locator:
    """Where a node's values can be opened, kept from its rows once they are gone: per node, its recorded steps
    and the first iteration (>= 0) it has in each, as two NumPy arrays, and which roles have unbatched rows."""

    unbatched_roles: dict[str, set[str]] = field(default_factory=dict)  # roles with a row of aggregation none
    batched_roles: dict[str, set[str]] = field(default_factory=dict)  # roles with a row of another aggregation
    first_iterations: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def unbatched(self, node: str) -> set[str]:
        return self.unbatched_roles.get(node, set())

    def only_unbatched(self, node: str, role: str) -> bool:
        return role in self.unbatched(node) and role not in self.batched_roles.get(node, set())

    def iteration_of(self, data: TrialData, node: str, step: int) -> int:
        steps, iterations = self.first_iterations.get(node, (np.zeros(0, np.int64), np.zeros(0, np.int32)))
        at = int(np.searchsorted(steps, step))
        if at < len(steps) and steps[at] == step:
            return int(iterations[at])
        step_iterations = data.steps.loc[data.steps["training_step"] == step, "iteration"]
        return int(step_iterations.min()) if len(step_iterations) else 0

    def add(self, data: TrialData) -> None:
        """Add the rows of some nodes over some steps (a window: steps never seen before for these nodes)."""
        stats = data.stats
        unbatched = stats["aggregation"] == "none"
        for found, rows in ((self.unbatched_roles, stats[unbatched]), (self.batched_roles, stats[~unbatched])):
            for node, roles in rows.groupby("node", observed=True)["role"]:
                found.setdefault(str(node), set()).update(str(r) for r in roles.unique())
        located = stats[stats["iteration"] >= 0]
        first = located.groupby(["node", "training_step"], observed=True)["iteration"].min()
        for node, series in first.groupby(level=0, observed=True):
            steps = series.index.get_level_values(1).to_numpy(np.int64)
            iterations = series.to_numpy().astype(np.int32)
            known = self.first_iterations.get(str(node))
            if known is not None:
                steps, iterations = np.concatenate([known[0], steps]), np.concatenate([known[1], iterations])
                order = np.argsort(steps, kind="stable")
                steps, iterations = steps[order], iterations[order]
            self.first_iterations[str(node)] = (steps, iterations)


@dataclass
class _Gathered:
    """What the scan keeps between node groups."""

    bad_first: dict[str, pa.Table] = field(default_factory=dict)  # kind -> rows of its first bad step
    bad_later: list[pa.Table] = field(default_factory=list)  # kind, node, training_step of later bad steps
    samples: list[pa.Table] = field(default_factory=list)  # the subsample for correlation hints
    all_steps: np.ndarray | None = None
    stride: int = 1
    levels: list[pd.DataFrame] = field(default_factory=list)
    growth: list[tuple[str, float, Finding]] = field(default_factory=list)
    ends: list[pd.DataFrame] = field(default_factory=list)
    outliers: list = field(default_factory=list)
    locator: Locator = field(default_factory=Locator)
    findings: list[Finding] = field(default_factory=list)  # of the detectors that judge a node by itself
    problems: list[str] = field(default_factory=list)
    losses: list[pd.DataFrame] = field(default_factory=list)  # training_step, mean of the registered loss
    paces: dict[str, float] = field(default_factory=dict)  # parameter node -> its pace (detectors.learning_of)


def scan_trial(trial: TrialReader, options: ScanOptions,
               progress: Callable[[int, int], object] | None = None) -> tuple[list[Finding], list[str]]:
    """Findings and problems of one trial, streamed; ``progress(done, total)`` counts chunks, then groups.
    One streamed trial at a time: trials scanned side by side would add up their groups' memory."""
    with _ONE_AT_A_TIME:
        try:
            return _scan_trial(trial, options, progress)
        finally:
            loading.return_freed_memory()


def _scan_trial(trial: TrialReader, options: ScanOptions,
                progress: Callable[[int, int], object] | None) -> tuple[list[Finding], list[str]]:
    context = loading.trial_context(trial)
    facts = graphs.facts(context.graphs.values())
    paths = trial.tensor_chunks()
    rows = loading.recorded_rows(trial)
    count = max(1, math.ceil(rows / GROUP_ROWS))
    nodes = sorted(facts.column, key=lambda n: (facts.column[n], n))
    group_of = {node: index % count for index, node in enumerate(nodes)}  # a mix of early and late nodes each
    total, gathered = len(paths) + count, _Gathered()
    with tempfile.TemporaryDirectory(prefix="comgra-scan-") as folder:
        spill = _Spill(Path(folder), group_of, count, np.array(sorted(context.known), dtype=np.int64),
                       windows=max(1, math.ceil(rows / GROUP_ROWS)))
        for done, path in enumerate(paths, 1):
            try:
                for part in _chunk_parts(trial, path):
                    _split_chunk(part, context, gathered, spill)
            except (OSError, pa.ArrowException) as error:  # damaged past its first column: the rows before stay
                gathered.problems.append(f"skipped {layout.chunk_label(path)} from where it is damaged: {error}")
            if progress is not None:
                progress(done, total)
        spill.close()
        context = loading.trial_context(trial)  # again: damaged chunks are known once they were read
        for index in range(count):
            _scan_group(spill, index, context, facts, options, gathered)
            # else the heap keeps the largest group's pages, and then some
            loading.return_freed_memory(collect=(index + 1) % COLLECT_EVERY_GROUPS == 0)
            if progress is not None:
                progress(len(paths) + index + 1, total)
    return _conclude(context, facts, options, gathered)


def _chunk_parts(trial: TrialReader, path: Path) -> Iterator[pa.Table]:
    """A chunk in parts of about ``BATCH_ROWS`` rows: a merged chunk of thousands of steps is never held whole.

    Read with pyarrow, not through the reader's DuckDB: DuckDB keeps the Parquet footer of every file it
    read for as long as the reader lives, and the footers of a long recording's chunks (thousands of row
    groups each) took about 400 MiB of the heap per trial of the 192-node 50x recording, through the rest
    of the scan. A chunk pyarrow cannot open (damaged, merged away by a live writer, an older layout) goes
    to the reader, which lists a damaged one and reads the others as always; damage further in is caught
    by the caller, which keeps the rows before it."""
    if not trial.has_tensor_schema(path):  # reported by the reader: a retyped column is junk, not values
        return
    try:
        trial.fetch(path)  # a recording at a URL: the whole chunk into its local copy (store.ranges)
        parquet = pq.ParquetFile(path, page_checksum_verification=True)  # a failing page raises: caught by the caller
        # Format 3: the rank is the chunk's folder's, not a column.
        rank = None if "rank" in parquet.schema_arrow.names else layout.rank_of_chunk(path)
        batches = parquet.iter_batches(batch_size=BATCH_ROWS,
                                       columns=[c for c in loading.COLUMNS if rank is None or c != "rank"])
    except (OSError, ValueError, KeyError, pa.ArrowException):
        table = trial.read_tensor_chunk(path, loading.COLUMNS)
        if table.num_rows:
            yield table
        return
    try:
        for batch in batches:
            table = pa.Table.from_batches([batch])
            if rank is not None:
                table = table.append_column(fmt.RANK_FIELD, pa.repeat(pa.scalar(rank, pa.int32()), table.num_rows))
            yield table.select(loading.COLUMNS)
    finally:
        parquet.close()


class _Spill:
    """The temporary Arrow files of a streamed scan: one (or, for rows that come late, a few) per node group and
    window of steps, so that a node's long run is read back a window at a time. A window holds about
    ``GROUP_ROWS`` rows of all nodes together; a group's windows are read back in batches of about as many."""

    def __init__(self, folder: Path, group_of: dict[str, int], count: int, all_steps: np.ndarray,
                 windows: int) -> None:
        self.folder, self.group_of, self.count, self.all_steps = folder, group_of, count, all_steps
        self.windows = max(1, min(windows, len(all_steps)))
        self.files: dict[tuple[int, int], list[Path]] = {}
        self.rows: dict[tuple[int, int], int] = {}
        self._writers: dict[tuple[int, int], pa.ipc.RecordBatchFileWriter] = {}

    def keys_of(self, table: pa.Table) -> np.ndarray:
        """Per row, its group and window as one number (group * windows + window)."""
        # One group number per distinct node name, then one lookup per row (no Python string per row).
        encoded = pc.dictionary_encode(table["node"]).combine_chunks()
        numbers = np.array([self.group_of.get(n, zlib.crc32(n.encode()) % self.count)
                            for n in encoded.dictionary.to_pylist()], np.int64)
        groups = numbers[encoded.indices.to_numpy(zero_copy_only=False)]
        position = np.searchsorted(self.all_steps, table["training_step"].to_numpy())
        return groups * self.windows + position * self.windows // max(1, len(self.all_steps))

    def write(self, table: pa.Table) -> None:
        keys = self.keys_of(table)
        order = np.argsort(keys, kind="stable")
        # Selected and cast once, not once per slice (a part holds a slice per group and window).
        keys, table = keys[order], table.select(_SPILLED.names).take(pa.array(order)).cast(_SPILLED)
        starts = np.concatenate([[0], np.flatnonzero(np.diff(keys)) + 1, [len(keys)]])
        for start, end in zip(starts[:-1], starts[1:]):
            key = divmod(int(keys[start]), self.windows)
            if key not in self._writers:
                path = self.folder / f"{key[0]}-{key[1]}-{len(self.files.get(key, []))}.arrow"
                self.files.setdefault(key, []).append(path)
                self._writers[key] = pa.ipc.new_file(str(path), _SPILLED)
            self._writers[key].write_table(table.slice(start, end - start))
            self.rows[key] = self.rows.get(key, 0) + int(end - start)
        # Chunks come in the order of their steps: the windows before this part's are complete.
        self.close(before=int((keys % self.windows).min()) if len(keys) else 0)

    def close(self, before: int | None = None) -> None:
        for key in [k for k in self._writers if before is None or k[1] < before]:
            self._writers.pop(key).close()

    def batches(self, group: int) -> Iterator[list[Path]]:
        """The files of a group, window after window, in batches of about ``GROUP_ROWS`` rows."""
        batch: list[Path] = []
        rows = 0
        for key in sorted(k for k in self.files if k[0] == group):
            if batch and rows + self.rows[key] > GROUP_ROWS:
                yield batch
                batch, rows = [], 0
            batch.extend(self.files[key])
            rows += self.rows[key]
        if batch:
            yield batch


def _split_chunk(table: pa.Table, context: TrialContext, gathered: _Gathered, spill: _Spill) -> None:
    if not table.num_rows:
        return
    table = table.combine_chunks()
    listed = pc.is_in(table["training_step"], pa.array(sorted(context.known), pa.int64()))
    if pc.all(listed).as_py() is False:  # values of a step the index does not list are not a step
        table = table.filter(listed)
    _gather_non_finite(table, gathered)
    _gather_samples(table, context, gathered)
    losses = table.filter(pc.and_(pc.equal(table["kind"], fmt.FORWARD), pc.equal(table["tensor_type"], "loss")))
    if losses.num_rows:  # one row per step: what explained() asks of the loss
        gathered.losses.append(losses.select(["training_step", "mean"]).to_pandas())
    # Per-sample gradients: no detector of one node reads them (the non-finite ones were taken above).
    table = table.filter(pc.invert(pc.and_(pc.not_equal(table["kind"], fmt.FORWARD),
                                           pc.equal(table["aggregation"], "sample"))))
    if table.num_rows:
        spill.write(table)


def _gather_non_finite(table: pa.Table, gathered: _Gathered) -> None:
    bad = table.filter(pc.or_(pc.greater(table["nan_count"], 0), pc.greater(table["inf_count"], 0)))
    if not bad.num_rows:
        return
    bad = bad.select(KEYS + STATS)
    for kind in pc.unique(bad["kind"]).to_pylist():
        rows = bad.filter(pc.equal(bad["kind"], kind))
        first = pc.min(rows["training_step"]).as_py()
        known = gathered.bad_first.get(kind)
        known_step = None if known is None else known["training_step"][0].as_py()
        if known_step is None or first < known_step:
            if known is not None:
                gathered.bad_later.append(_bad_steps(known))
            gathered.bad_first[kind] = rows.filter(pc.equal(rows["training_step"], first))
            rows = rows.filter(pc.not_equal(rows["training_step"], first))
        elif first == known_step:
            gathered.bad_first[kind] = pa.concat_tables([known, rows.filter(pc.equal(rows["training_step"], first))])
            rows = rows.filter(pc.not_equal(rows["training_step"], first))
        if rows.num_rows:
            gathered.bad_later.append(_bad_steps(rows))


def _bad_steps(rows: pa.Table) -> pa.Table:
    """Which node had a non-finite value at which step, once each: all the non-finite detector asks of a
    step that is not the first."""
    return rows.group_by(["kind", "node", "training_step"]).aggregate([]).select(["kind", "node", "training_step"])


def _gather_samples(table: pa.Table, context: TrialContext, gathered: _Gathered) -> None:
    """Keep the per-sample rows of every ``stride``-th recorded step; when they pass the cap, double the
    stride and drop the steps it no longer keeps. Deterministic: the same recording keeps the same steps."""
    samples = table.filter(pc.and_(pc.equal(table["kind"], fmt.FORWARD), pc.equal(table["aggregation"], "sample")))
    if not samples.num_rows:
        return
    if gathered.all_steps is None:
        gathered.all_steps = np.array(sorted(context.known), dtype=np.int64)
    gathered.samples.append(_every(samples, gathered.all_steps, gathered.stride))
    while sum(t.num_rows for t in gathered.samples) > _correlation_rows() and gathered.stride < len(
            gathered.all_steps):
        gathered.stride *= 2
        gathered.samples = [_every(t, gathered.all_steps, gathered.stride) for t in gathered.samples]


def _every(table: pa.Table, all_steps: np.ndarray, stride: int) -> pa.Table:
    """The rows of ``table`` whose step is every ``stride``-th of the recorded steps."""
    position = np.searchsorted(all_steps, table["training_step"].to_numpy())
    return table.filter(pa.array(position % stride == 0))


@dataclass
class _Parts:
    """What the detectors of one node keep of a node group's windows, merged window after window."""

    dead: dict = field(default_factory=dict)
    saturated: dict = field(default_factory=dict)
    parameters: dict = field(default_factory=dict)
    one_sided: list[pd.DataFrame] = field(default_factory=list)
    collapse: list[pd.DataFrame] = field(default_factory=list)
    outliers: list[pd.DataFrame] = field(default_factory=list)
    growth: list[pd.DataFrame] = field(default_factory=list)

    def add(self, data: TrialData, options: ScanOptions, gathered: _Gathered) -> None:
        for name, into, work in (("dead_units", self.dead, lambda: units.dead_parts(data)),
                                 ("saturated_units", self.saturated, lambda: units.saturated_parts(data, options)),
                                 ("parameters", self.parameters, lambda: parameters.parts(data))):
            for key, part in (_guarded(name, data, gathered, work) or {}).items():
                into[key] = into[key].merge(part) if key in into else part
        for name, steps, work in (("one_sided", self.one_sided, lambda: units.one_sided_steps(data)),
                                 ("collapse", self.collapse, lambda: trends.collapse_steps(data)),
                                 ("outliers", self.outliers, lambda: outliers.outlier_steps(data)),
                                 ("growth", self.growth, lambda: trends.growth_steps(data))):
            found = _guarded(name, data, gathered, work)
            if found is not None:
                steps.append(found)


def _scan_group(spill: _Spill, index: int, context: TrialContext, facts: graphs.GraphFacts, options: ScanOptions,
                gathered: _Gathered) -> None:
    """The detectors of one node over a group's nodes, reading the group a batch of windows at a time: what
    they keep between windows is a few numbers per unit and a few per step, not the rows."""
    parts = _Parts()
    for paths in spill.batches(index):
        tables = []
        for path in paths:
            with pa.memory_map(str(path)) as source:
                tables.append(pa.ipc.open_file(source).read_all())
        data = loading.assemble(context, [loading.chunk_data(pa.concat_tables(tables))])
        del tables
        if not len(data.stats):
            continue
        parts.add(data, options, gathered)
        levels = _guarded("gradients", data, gathered, lambda: trends.gradient_levels(data, facts))
        if levels is not None and len(levels):
            # As Arrow, names dictionary-encoded: a few bytes per node and step.
            gathered.levels.append(pa.Table.from_pandas(levels.assign(
                node=loading.as_text(levels["node"]).astype("category"),
                role=loading.as_text(levels["role"]).astype("category"),
                kind=loading.as_text(levels["kind"]).astype("category")), preserve_index=False))
        gathered.locator.add(data)
        del data
    _judge_group(parts, context, facts, options, gathered)


def _judge_group(parts: _Parts, context: TrialContext, facts: graphs.GraphFacts, options: ScanOptions,
                 gathered: _Gathered) -> None:
    skeleton = _skeleton(context, gathered)
    judged = [
        ("dead_units", lambda: units.dead_judged(skeleton, facts, options, parts.dead)),
        ("saturated_units", lambda: units.saturated_judged(skeleton, facts, options, parts.saturated)),
        ("one_sided", lambda: units.one_sided_judged(skeleton, facts, options, _joined(parts.one_sided)))
         if parts.one_sided else None,
        ("collapse", lambda: trends.collapse_judged(skeleton, facts, options, _joined(parts.collapse)))
         if parts.collapse else None,
        ("parameters", lambda: parameters.judged(skeleton, facts, options, parts.parameters)),
    ]
    for name, work in filter(None, judged):
        gathered.findings.extend(_guarded(name, skeleton, gathered, work) or [])
    gathered.paces.update(paces_of(parts.parameters))
    if parts.outliers:
        found = _guarded("outliers", skeleton, gathered, lambda: outliers.located(skeleton, outliers.strongest_of(
            outliers.candidates_from(skeleton, facts, options, pd.concat(parts.outliers)))))
        gathered.outliers = outliers.strongest_of(gathered.outliers + (found or []))
    if parts.growth:
        grown = _guarded("growth", skeleton, gathered, lambda: trends.growth_candidates_from(
            skeleton, facts, options, _joined(parts.growth)))
        if grown:
            gathered.growth.extend(grown[0])
            gathered.ends.append(grown[1])


def _joined(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def _skeleton(context: TrialContext, gathered: _Gathered) -> TrialData:
    """A trial without rows: the detectors' judgements open a node's values through the locator."""
    return TrialData(context.trial, _empty_stats(), {}, context.steps, context.graphs, list(context.problems),
                     locator=gathered.locator, reader=context.reader)


def _guarded(name: str, data: TrialData, gathered: _Gathered, work: Callable):
    """Run one detector's part; a failure is reported and the others still run (as ``detect_all`` does)."""
    try:
        result = work()
    except SelectionError:
        raise
    except Exception as error:  # noqa: BLE001 - one detector's fault must not hide the others' findings
        problem = f"detector {name} failed on trial {data.trial!r}: {type(error).__name__}: {error}"
        if problem not in gathered.problems:
            gathered.problems.append(problem)
        return None
    return result


def _conclude(context: TrialContext, facts: graphs.GraphFacts, options: ScanOptions,
              gathered: _Gathered) -> tuple[list[Finding], list[str]]:
    skeleton = _skeleton(context, gathered)
    samples = loading.assemble(context, [loading.chunk_data(t) for t in gathered.samples])
    if gathered.stride > 1:
        samples.subsample = (f"samples of every {_ordinal(gathered.stride)} recorded step only, a subsample that "
                             f"keeps the scan's memory bounded ({_correlation_rows()} per-sample rows)")
    if options.target is not None:
        correlation.pick_target(samples, facts, options.target)  # an unknown --target is the user's error
    findings = list(gathered.findings)
    problems = [f"skipped {p}" for p in context.problems] + gathered.problems
    steps = [
        ("non_finite", lambda: nonfinite.detect(_non_finite_data(context, gathered), facts)),
        ("gradients", lambda: trends.gradients_from_levels(skeleton, facts, options, _levels(gathered))
         if gathered.levels else []),
        ("growth", lambda: trends.growth_beyond_typical(
            gathered.growth, pd.concat(gathered.ends) if gathered.ends else pd.DataFrame({"kind": [], "abs_max": []}))),
        ("outliers", lambda: outliers.confirmed(skeleton, facts, options, gathered.outliers)),
        ("correlation", lambda: correlation.detect(samples, facts, options) if len(samples.stats) else []),
        # The evidence beside the tensors (runinfo, sentinels, layers): small tables, read whole as in memory.
        *[(name, lambda d=detect: d(skeleton, facts, options)) for name, detect in evidence_detectors.EVIDENCE.items()],
    ]
    for name, work in steps:
        try:
            findings.extend(work())
        except SelectionError:
            raise
        except Exception as error:  # noqa: BLE001 - as above
            problems.append(f"detector {name} failed on trial {context.trial!r}: {type(error).__name__}: {error}")
    findings = evidence_detectors.sentinel_events.reattribute(skeleton, findings)
    findings.extend(cooccurrence.detect(findings, int(context.steps["training_step"].nunique())))
    losses = pd.concat(gathered.losses) if gathered.losses else pd.DataFrame({"training_step": [], "mean": []})
    fall = updates.fall_of(losses.groupby("training_step")["mean"].mean().sort_index().to_numpy(np.float64))
    return rank_findings(explained(findings, fall, *learning_of(gathered.paces, facts))), problems


def _levels(gathered: _Gathered) -> pd.DataFrame:
    table = pa.concat_tables(gathered.levels, promote_options="permissive")
    gathered.levels = []
    return table.to_pandas()


def _non_finite_data(context: TrialContext, gathered: _Gathered) -> TrialData:
    """The first bad step's rows of each kind, and one row per later (kind, node, step) with a bad value."""
    parts = [t.to_pandas() for t in gathered.bad_first.values()]
    if gathered.bad_later:
        later = pa.concat_tables(gathered.bad_later).group_by(["kind", "node", "training_step"]).aggregate([])
        frame = later.to_pandas()
        first = {kind: t["training_step"][0].as_py() for kind, t in gathered.bad_first.items()}
        frame = frame[[step != first.get(kind) for kind, step in zip(frame["kind"], frame["training_step"])]]
        parts.append(frame.assign(nan_count=1.0, inf_count=0.0, iteration=-1, role="", aggregation="mean", sample=-1))
    stats = pd.concat(parts, ignore_index=True) if parts else _empty_stats()
    if loading.observe_rows is not None:
        loading.observe_rows(len(stats))
    return TrialData(context.trial, stats, {}, context.steps, context.graphs, [])


def _correlation_rows() -> int:
    return GROUP_ROWS if CORRELATION_ROWS is None else CORRELATION_ROWS


def _ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def _empty_stats() -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=object) for name in KEYS + STATS})

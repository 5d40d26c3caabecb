"""The Runs questions (issue 30): one row per trial of a sweep, filtered, sorted, paged, grouped.

A row holds the trial's hyperparameters (``store.hyperparameters``), the last, best, min and max of
each KPI, its saved findings by severity (``analysis.saved``: what ``comgra scan`` or the app's
background scanner found), its status, how many training steps it reached and how long it ran.

Status, from what is on disk: **running** while a process holds the trial's writer lock (the kernel
frees it however the process ends; a run paused at a breakpoint is running); **finished** once
``finalize`` wrote ``finished`` into trial.json (older recordings: once it wrote their types of
execution); **crashed** otherwise (the process ended without ``finalize``: killed, out of memory,
an exception that skipped it). Steps: the highest training step seen in the steps index, the
sentinels (every step) and the KPI timepoints, plus one. Duration: ``finished`` minus ``created``;
for a running trial, now minus ``created``; unknown (None) for a crashed one.

A row is computed once per change of its trial (``service.changes``): with 1,000 finished trials an
answer lists the trials folder once and reads no chunk. The rows are also kept in the group's runs summary
(``service.runs_summary``, one small Parquet file), so that a fresh app takes the rows of the trials that
did not change since from there and computes only the others. "Best" is the minimum, or the maximum for a
KPI whose name says higher is better (``HIGHER_IS_BETTER``: accuracy, f1, auc, reward, ...).

    >>> RunQuestions(trial_questions, options).page(filter="lr=0.01", sort="-kpis.loss/train.best")  # doctest: +SKIP
"""
from __future__ import annotations

import functools
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from comgra.analysis import saved
from comgra.analysis.findings import ScanOptions
from comgra.errors import ComgraError, ConfigError, did_you_mean
from comgra.service import runs_summary
from comgra.service.changes import TrialState
from comgra.service.run_summaries import HIGHER_IS_BETTER, Summary, kpi_summaries
from comgra.service.trials import TrialQuestions
from comgra.store import chunk_checks, layout
from comgra.store import format as fmt
from comgra.store import hyperparameters as hyperparameter_store
from comgra.store.reader import TrialReader

KPI_STATISTICS = ("last", "best", "min", "max")
SEVERITIES = ("error", "warning", "info")
STATUSES = ("running", "finished", "crashed")
COLUMNS = ("trial", "status", "steps", "duration")
MAX_FILTER = 1000
SORT_KEY = re.compile(r"hyperparameters\..+|kpis\..+\.(last|best|min|max)|findings\.(error|warning|info)", re.S)


@dataclass(frozen=True)
class Run:
    """One trial of the Runs view; ``as_json`` is the REST answer's row."""

    trial: str
    hyperparameters: dict[str, Any]
    kpis: dict[str, dict[str, float | None]]
    findings: dict[str, int]
    status: str
    steps: int
    created: float | None = None
    ended: float | None = None  # the ``finished`` time of trial.json
    problems: tuple[str, ...] = ()

    @property
    def duration(self) -> float | None:
        if self.created is None:
            return None
        if self.status == "running":
            return max(0.0, time.time() - self.created)
        return None if self.ended is None else max(0.0, self.ended - self.created)

    def as_json(self) -> dict[str, Any]:
        return {"trial": self.trial, "hyperparameters": self.hyperparameters, "kpis": self.kpis,
                "findings": self.findings, "status": self.status, "steps": self.steps, "duration": self.duration}

    def value(self, column: str) -> Any:
        """The value a sort key names: a column of ``COLUMNS``, ``hyperparameters.<name>``,
        ``kpis.<kpi>.<statistic>`` or ``findings.<severity>``."""
        if column in COLUMNS:
            return getattr(self, column)
        section, _, rest = column.partition(".")
        if section == "hyperparameters":
            return self.hyperparameters.get(rest)
        if section == "kpis":
            name, _, statistic = rest.rpartition(".")
            return self.kpis.get(name, {}).get(statistic)
        return self.findings.get(rest)


@dataclass(frozen=True)
class RunPage:
    runs: list[Run]
    total: int  # rows that pass the filter, before offset and limit
    columns: list[str] = field(default_factory=list)  # every sort key the rows have


@dataclass(frozen=True)
class GroupBand:
    """A KPI over the trials of one value of a hyperparameter (seeds): mean and min/max per timepoint."""

    value: Any
    trials: list[str]
    timepoint: list[int]
    mean: list[float]
    low: list[float]
    high: list[float]


class RunQuestions:
    """The rows of the Runs view for one group, computed once per change of each trial. Thread-safe."""

    def __init__(self, trials: TrialQuestions, options: Callable[[], ScanOptions]):
        self.trial_questions = trials
        self.options = options  # the scan options whose saved findings are counted
        self._rows: dict[str, tuple[TrialState, Run]] = {}
        self._findings: dict[str, tuple[Any, dict[str, int]]] = {}
        self._lock = threading.Lock()
        self.computed = 0  # rows computed so far (tests and the benchmark read it)
        self._kept: dict[str, runs_summary.KeptRow] | None = None  # the group's runs summary, read at the first answer
        self.taken = 0  # rows taken from the runs summary so far, not computed (tests and the benchmark read it)
        self.kept_writes = 0  # times the runs summary was written (tests read it)

    def runs(self) -> list[Run]:
        """Every trial's row, sorted by trial id. A fresh service takes the rows of the group's runs summary
        (``service.runs_summary``) whose trial did not change since, and computes the others."""
        states = self.trial_questions.poll().states
        options = self.options()
        with self._lock:
            if self._kept is None:
                self._kept = runs_summary.read(self.trial_questions.group.path)
            for trial in [t for t in self._rows if t not in states]:
                del self._rows[trial]
                self._findings.pop(trial, None)
            stale = [t for t in sorted(states) if t not in self._rows or self._rows[t][0] != states[t]]
            kept = {t: k for t in stale if (k := self._kept.get(t)) is not None and not states[t].live
                    and k.folder == states[t].folder}
            made = {**self._rows_of([t for t in stale if t not in kept], states),
                    **{t: _run_of(k) for t, k in kept.items()}}
            for trial in stale:
                self._rows[trial] = (states[trial], made[trial])
                self.computed += trial not in kept
                self.taken += trial in kept
            for trial, row in kept.items():  # counts of the same findings file need no reading
                if row.counts is not None and trial not in self._findings:
                    self._findings[trial] = (row.findings, row.counts)
            runs = [_with_findings(self._rows[t][1], self._finding_counts(t, options)) for t in sorted(states)]
            self._keep(runs, states)
            return runs

    def _keep(self, runs: list[Run], states: Mapping[str, TrialState]) -> None:
        """Write the rows of the trials no writer holds (and without problems) to the group's runs summary, where
        they differ from what it holds."""
        rows = [runs_summary.KeptRow(r.trial, states[r.trial].folder, r.status, r.steps, r.created, r.ended,
                                     r.hyperparameters, r.kpis, self._findings[r.trial][0],
                                     self._findings[r.trial][1])
                for r in runs if not states[r.trial].live and not r.problems and r.status != "running"]
        if {row.trial: row for row in rows} != self._kept and runs_summary.write(self.trial_questions.group.path, rows):
            self._kept = {row.trial: row for row in rows}
            self.kept_writes += 1

    def page(self, *, filter: str | None = None, sort: str | None = None, offset: int = 0,
             limit: int | None = None) -> RunPage:
        """The rows that pass ``filter`` (a regex, searched in the trial id, in each hyperparameter value and in
        ``name=value``), sorted by ``sort`` (a key of ``Run.value``; a leading ``-`` sorts descending; rows
        without the value last), from ``offset``, at most ``limit``."""
        rows = self.runs()
        columns = sort_keys(rows)
        if filter:
            pattern = compile_filter(filter)
            rows = [r for r in rows if matches(pattern, r)]
        if sort:
            rows = sort_runs(rows, sort, columns)
        end = None if limit is None else offset + limit
        return RunPage(rows[offset:end], len(rows), columns)

    def group_bands(self, trials: list[str], by: str, kpi: str) -> list[GroupBand]:
        """``kpi``'s mean and min/max band over the trials of each value of hyperparameter ``by``."""
        rows = {r.trial: r for r in self.runs()}
        groups: dict[Any, list[str]] = {}
        for trial in trials:
            if trial in rows:
                groups.setdefault(rows[trial].hyperparameters.get(by), []).append(trial)
        group_name, _, kpi_name = kpi.partition("/")
        bands = []
        for value, members in sorted(groups.items(), key=lambda item: _order(item[0])):
            series = [self._series(t, group_name, kpi_name) for t in members]
            bands.append(band(value, members, [s for s in series if s is not None]))
        return bands

    # -- one trial --------------------------------------------------------------------------------
    def _rows_of(self, stale: list[str], states: Mapping[str, TrialState]) -> dict[str, Run]:
        """The rows of ``stale``: each trial's metadata and hyperparameters (small JSON documents), the KPI
        summaries of all of them in one engine query (``service.run_summaries``); a trial whose KPI chunks that
        query cannot read, or of an older format, is summarised from its own reader (which reports the damage)."""
        rows: dict[str, Run] = {}
        opened: dict[str, tuple[TrialReader, dict[str, Any]]] = {}
        files: dict[str, list[Path]] = {}
        for trial in stale:
            try:
                reader = self.trial_questions.trial(trial)
                opened[trial] = (reader, hyperparameter_store.read(reader.directory))
            except ComgraError as error:
                rows[trial] = _unreadable(trial, states[trial], error)
                continue
            if reader.format_version >= 3:
                files[trial] = _kpi_files(reader)
        summaries = _summaries(files)
        for trial, (reader, values) in opened.items():
            summary = summaries.get(trial)
            if summary is None:
                try:
                    table = reader.kpis()
                except ComgraError as error:
                    rows[trial] = _unreadable(trial, states[trial], error)
                    continue
                summary = Summary(kpi_summary(table), pc.max(table["timepoint"]).as_py() if table.num_rows else None)
            rows[trial] = self._row(trial, states[trial], reader, values, summary)
        return rows

    def _row(self, trial: str, state: TrialState, reader: TrialReader, values: dict[str, Any],
             summary: Summary) -> Run:
        metadata = reader.metadata
        status = "running" if state.live else "finished" if metadata.get("finished") or metadata.get(
            "types_of_execution") else "crashed"
        last_step = max([-1, *_last_steps(reader),
                         *([summary.last_timepoint] if summary.last_timepoint is not None else [])])
        return Run(trial, values, summary.kpis, {}, status, last_step + 1, _number(metadata.get("created")),
                   _number(metadata.get("finished")))

    def _finding_counts(self, trial: str, options: ScanOptions) -> dict[str, int]:
        """Counts by severity of the trial's saved findings; read again only when their file changed."""
        directory = fmt.trial_dir(self.trial_questions.group.path, trial)
        key = runs_summary.findings_key(directory / _saved_name(options))
        kept = self._findings.get(trial)
        if kept is not None and kept[0] == key:
            return kept[1]
        counts = dict.fromkeys(SEVERITIES, 0)
        # The group's reader, opened for the row already (it opens a DuckDB connection only on a query, and the
        # signature check needs the chunk listing only).
        try:
            found = saved.read(self.trial_questions.trial(trial), options) if key is not None else None
        except ComgraError:  # its metadata went bad meanwhile: no counts, the row still shows
            found = None
        for finding in found.findings if found is not None else []:
            counts[finding.severity] = counts.get(finding.severity, 0) + 1
        self._findings[trial] = (key, counts)
        return counts

    def _series(self, trial: str, group: str, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        try:
            table = self.trial_questions.kpis(trial)
        except ComgraError:
            return None
        mask = pc.and_(pc.equal(table["kpi_group"], group), pc.equal(table["kpi_name"], name))
        chosen = table.filter(mask).sort_by("timepoint")
        if not chosen.num_rows:
            return None
        return chosen["timepoint"].to_numpy(), chosen["value"].to_numpy(zero_copy_only=False)


# -- pure helpers ---------------------------------------------------------------------------------
def kpi_summary(table: pa.Table) -> dict[str, dict[str, float | None]]:
    """``{"group/name": {"last", "best", "min", "max"}}`` of a KPI table (NaN points are skipped)."""
    summary: dict[str, dict[str, float | None]] = {}
    if not table.num_rows:
        return summary
    table = table.sort_by([("kpi_group", "ascending"), ("kpi_name", "ascending"), ("timepoint", "ascending")])
    groups, names = table["kpi_group"].to_pylist(), table["kpi_name"].to_pylist()
    values = table["value"].to_numpy(zero_copy_only=False).astype(float)
    start = 0
    for end in range(1, len(groups) + 1):
        if end < len(groups) and (groups[end], names[end]) == (groups[start], names[start]):
            continue
        key = f"{groups[start]}/{names[start]}"
        finite = values[start:end][np.isfinite(values[start:end])]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (None, None)
        summary[key] = {"last": float(finite[-1]) if finite.size else None,
                        "best": high if HIGHER_IS_BETTER.search(key) else low, "min": low, "max": high}
        start = end
    return summary


def compile_filter(text: str) -> re.Pattern[str]:
    if len(text) > MAX_FILTER:
        raise ConfigError(f"filter is {len(text)} characters long; at most {MAX_FILTER}.")
    try:
        return re.compile(text)
    except re.error as error:
        raise ConfigError(f"filter={text[:100]!r} is not a regular expression ({error}); e.g. 'lr=0\\.01' or "
                          "'^trial_0' (escape a literal '.', '(' or '[' with a backslash).") from None


def matches(pattern: re.Pattern[str], run: Run) -> bool:
    if pattern.search(run.trial):
        return True
    for name, value in run.hyperparameters.items():
        text = hyperparameter_store.text_of(value) or "None"
        if pattern.search(text) or pattern.search(f"{name}={text}"):
            return True
    return False


def sort_keys(rows: list[Run]) -> list[str]:
    names = sorted({n for r in rows for n in r.hyperparameters})
    kpis = sorted({k for r in rows for k in r.kpis})
    return [*COLUMNS, *(f"hyperparameters.{n}" for n in names),
            *(f"kpis.{k}.{s}" for k in kpis for s in KPI_STATISTICS), *(f"findings.{s}" for s in SEVERITIES)]


def sort_runs(rows: list[Run], sort: str, columns: list[str]) -> list[Run]:
    descending = sort.startswith("-")
    key = sort.lstrip("-+")
    if key not in columns and not SORT_KEY.fullmatch(key):  # a well-formed name no row has: every row lacks it
        raise ConfigError(f"sort={sort[:100]!r} is not a column of these runs" + did_you_mean(key, columns)
                          + " Prefix '-' to sort descending, e.g. sort=-kpis.loss/train.best.")
    present = [r for r in rows if _present(r.value(key))]
    missing = [r for r in rows if not _present(r.value(key))]
    return sorted(present, key=lambda r: _order(r.value(key)), reverse=descending) + missing


def band(value: Any, trials: list[str], series: list[tuple[np.ndarray, np.ndarray]]) -> GroupBand:
    """Mean, min and max over ``series`` at each timepoint any of them has (NaN points left out)."""
    if not series:
        return GroupBand(value, trials, [], [], [], [])
    steps = np.concatenate([s[0] for s in series])
    values = np.concatenate([s[1] for s in series]).astype(float)
    keep = np.isfinite(values)
    steps, values = steps[keep], values[keep]
    unique, inverse = np.unique(steps, return_inverse=True)
    sums = np.bincount(inverse, weights=values, minlength=unique.size)
    counts = np.bincount(inverse, minlength=unique.size)
    low = np.full(unique.size, np.inf)
    high = np.full(unique.size, -np.inf)
    np.minimum.at(low, inverse, values)
    np.maximum.at(high, inverse, values)
    return GroupBand(value, trials, unique.tolist(), (sums / np.maximum(counts, 1)).tolist(), low.tolist(),
                     high.tolist())


@functools.lru_cache(maxsize=8)
def _saved_name(options: ScanOptions) -> Path:
    """Where in a trial folder the findings of ``options`` are saved (hashed once, not once per trial)."""
    return saved.path_of(Path(), options)


def _unreadable(trial: str, state: TrialState, error: ComgraError) -> Run:
    return Run(trial, {}, {}, {}, "running" if state.live else "crashed", 0, problems=(str(error),))


def _kpi_files(reader: TrialReader) -> list[Path]:
    """The KPI chunks the reader would read (merged-away parts and foreign files left out), by listing only."""
    folders = layout.table_dirs(reader.directory, "kpis", reader.format_version)
    return [path for folder in folders for path in fmt.visible_chunks(fmt.chunk_files(folder))
            if chunk_checks.not_own_chunk(path, path.parent.parent) is None]


def _summaries(files: dict[str, list[Path]]) -> dict[str, Summary]:
    """``kpi_summaries`` of ``files``; where it cannot read them all, of each half, down to the trials it cannot
    read, which are left out (about twice the reading for one damaged chunk among a thousand trials)."""
    if not files:
        return {}
    found = kpi_summaries(files)
    if found is not None:
        return found
    if len(files) == 1:
        return {}
    trials = list(files)
    middle = len(trials) // 2
    return {**_summaries({t: files[t] for t in trials[:middle]}), **_summaries({t: files[t] for t in trials[middle:]})}


def _run_of(kept: runs_summary.KeptRow) -> Run:
    return Run(kept.trial, kept.hyperparameters, kept.kpis, {}, kept.status, kept.steps, kept.created, kept.ended)


def _with_findings(run: Run, counts: dict[str, int]) -> Run:
    return run if run.findings == counts else Run(**{**run.__dict__, "findings": counts})


def _last_steps(reader: TrialReader) -> list[int]:
    """The last training step each table's chunk names give (no file is opened), in the trial's layout (a trial
    that migrates meanwhile changes its folder: its row is computed again)."""
    return [fmt.step_range_of(name)[1] for table in ("steps", "sentinels") for name in reader.chunk_names(table)]


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _order(value: Any) -> tuple[int, Any]:
    """Numbers (and booleans) before strings, None last: a column of mixed values still sorts."""
    if value is None:
        return (2, 0)
    if isinstance(value, (int, float)):
        return (0, float(value))
    return (1, str(value))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

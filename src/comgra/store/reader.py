"""Read a recording: one API for the app, the REST API and users' own scripts.

DuckDB does the filtering; chunk names carry their step range, so a query for
one training step opens only the chunks that can hold it, and rows inside a
chunk are sorted by node so that Parquet statistics let DuckDB skip the rest.
Small tables (the step index, KPIs, notes) are cached per chunk file: chunks
are immutable, so a cache entry never goes stale, and a live run's new chunks
are picked up on the next call.

    >>> group = GroupReader("/path/to/root/group")          # doctest: +SKIP
    >>> trial = group.trial(group.trials()[0])              # doctest: +SKIP
    >>> trial.selection(training_step=0, node="input")      # doctest: +SKIP
"""
from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from comgra.errors import SelectionError, StoreError, did_you_mean
from comgra.store import format as fmt

_SELECTION_FILTERS = ("training_step", "kind", "iteration", "node", "role", "aggregation", "sample")


class GroupReader:
    """A group folder (``comgra_root_path/group``) with one or more trials."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser().resolve()
        if not self.path.is_dir():
            raise StoreError(f"No recording at {str(self.path)!r}: the folder does not exist. "
                             "Pass the group folder, i.e. comgra_root_path/group.")
        self._trials: dict[str, TrialReader] = {}
        self._lock = threading.Lock()

    def trials(self) -> list[str]:
        """The trials that have metadata on disk, sorted by name; new trials appear live."""
        root = self.path / fmt.TRIALS_DIR
        if not root.is_dir():
            return []
        return sorted(p.name for p in root.iterdir() if (p / fmt.TRIAL_META).is_file())

    def close(self) -> None:
        """Forget the opened trials, so that their DuckDB connections are freed once no query uses them.

        A later ``trial()`` opens a trial again. Call it before the interpreter exits:
        DuckDB reports objects that are still alive then as leaks.
        """
        with self._lock:
            self._trials = {}

    def trial(self, trial_id: str) -> TrialReader:
        with self._lock:
            if trial_id not in self._trials:
                known = self.trials()
                if trial_id not in known:
                    raise SelectionError(f"No trial {trial_id!r} in {str(self.path)!r}"
                                         + did_you_mean(trial_id, known))
                self._trials[trial_id] = TrialReader(fmt.trial_dir(self.path, trial_id))
            return self._trials[trial_id]


class TrialReader:
    """One trial. Every method reads only what its answer needs."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.trial_id = directory.name
        self.metadata = _read_metadata(directory)
        self.problems: list[str] = []  # corrupt chunks that were skipped, for a banner in the app
        self._cache: dict[tuple[str, str], pa.Table] = {}
        self._graphs: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._connection = duckdb.connect()
        # GLOBAL: a plain SET does not reach the per-thread cursors, which then re-read every footer.
        self._connection.execute("SET GLOBAL parquet_metadata_cache = true")
        self._local = threading.local()

    # -- small tables, cached per immutable chunk --------------------------------------------
    def steps(self) -> pa.Table:
        """One row per (training_step, iteration), sorted: the index of everything recorded."""
        return self._cached_table("steps").sort_by([("training_step", "ascending"), ("iteration", "ascending")])

    def kpis(self) -> pa.Table:
        return self._cached_table("kpis").sort_by([("kpi_group", "ascending"), ("timepoint", "ascending")])

    def notes(self) -> list[str]:
        table = self._cached_table("notes").sort_by([("wall_time", "ascending"), ("seq", "ascending")])
        return table.column("note").to_pylist()

    def graph(self, graph_hash: str) -> dict[str, Any]:
        """The dependency graph of one iteration (see the README for its fields)."""
        if graph_hash not in self._graphs:
            path = self.directory / "graphs" / f"{graph_hash}.json"
            try:
                self._graphs[graph_hash] = json.loads(path.read_text())
            except (OSError, ValueError) as error:
                raise StoreError(f"Graph {graph_hash!r} of trial {self.trial_id!r} is unreadable ({error}); "
                                 "the recording may still be in progress or was damaged.") from error
        return self._graphs[graph_hash]

    # -- tensor values -------------------------------------------------------------------------
    def selection(self, *, training_step: int, columns: list[str] | None = None, **filters: Any) -> pa.Table:
        """Rows of one training step, filtered by any of kind, iteration, node, role, aggregation, sample.

        Cost grows with the rows returned, not with the size of the recording.
        """
        unknown = set(filters) - set(_SELECTION_FILTERS)
        if unknown:
            raise SelectionError(f"Unknown filter(s) {sorted(unknown)}; valid filters: {list(_SELECTION_FILTERS)}")
        files = [p for p in self._files("tensors") if _covers(p.name, training_step)]
        return self._query(files, columns, {"training_step": training_step, **filters})

    def series(self, *, node: str, role: str, kind: str = fmt.FORWARD, iteration: int,
               aggregation: str = "mean", sample: int = -1, statistic: str = "mean") -> pa.Table:
        """One statistic of one tensor across every recorded step: columns training_step, value."""
        if statistic not in fmt.STATISTICS + ("svd_max",):
            raise SelectionError(f"Unknown statistic {statistic!r}" + did_you_mean(statistic, fmt.STATISTICS))
        filters = {"node": node, "role": role, "kind": kind, "iteration": iteration,
                   "aggregation": aggregation, "sample": sample}
        table = self._query(self._files("tensors"), ["training_step", statistic], filters)
        return table.rename_columns(["training_step", "value"]).sort_by("training_step")

    def _query(self, files: list[Path], columns: list[str] | None, filters: dict[str, Any]) -> pa.Table:
        if not files:
            return fmt.TENSORS_SCHEMA.empty_table().select(columns or fmt.TENSORS_SCHEMA.names)
        active = {k: v for k, v in filters.items() if v is not None}
        where = " AND ".join(f'"{k}" = ?' for k in active) or "TRUE"
        select = ", ".join(f'"{c}"' for c in columns) if columns else "*"
        sql = f"SELECT {select} FROM read_parquet(?) WHERE {where}"

        def run(paths: list[Path]) -> pa.Table:
            return self._cursor().sql(sql, params=[[str(p) for p in paths], *active.values()]).to_arrow_table()

        try:
            return run(files)
        except duckdb.Error:
            if not all(p.exists() for p in files):  # merged away by a live writer meanwhile: list again
                return self._query(self._refreshed(files), columns, filters)
            return self._query(self._readable(files), columns, filters) if self._drop_corrupt(files, run) else \
                fmt.TENSORS_SCHEMA.empty_table().select(columns or fmt.TENSORS_SCHEMA.names)

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        cursor = getattr(self._local, "cursor", None)
        if cursor is None:
            cursor = self._local.cursor = self._connection.cursor()
        return cursor

    # -- files -------------------------------------------------------------------------------------
    def _files(self, table: str) -> list[Path]:
        folder = self.directory / table
        if not folder.is_dir():
            return []
        bad = set(self.problems)
        paths = sorted(p for p in folder.glob("*.parquet") if not p.name.startswith(".") and str(p) not in bad)
        return fmt.visible_chunks(paths)

    def _refreshed(self, files: list[Path]) -> list[Path]:
        """The current chunks that hold the steps ``files`` held."""
        ranges = [fmt.step_range_of(p.name) for p in files]
        low, high = min(r[0] for r in ranges), max(r[1] for r in ranges)
        ranges_now = [(p, fmt.step_range_of(p.name)) for p in self._files("tensors")]
        return [p for p, (first, last) in ranges_now if first <= high and last >= low]

    def _readable(self, files: list[Path]) -> list[Path]:
        return [p for p in files if str(p) not in self.problems]

    def _drop_corrupt(self, files: list[Path], run: Callable[[list[Path]], pa.Table]) -> bool:
        """Find the chunks DuckDB could not read, remember them, and say whether any were found."""
        found = False
        for path in files:
            try:
                pq.read_metadata(path)
            except Exception:  # noqa: BLE001 - any failure to parse means the chunk is unusable
                self.problems.append(str(path))
                found = True
        if not found:  # an intact footer over damaged pages: only reading the chunk on its own tells
            for path in files:
                try:
                    run([path])
                except duckdb.Error:
                    self.problems.append(str(path))
                    found = True
        return found

    def _cached_table(self, table: str) -> pa.Table:
        parts = []
        for path in self._files(table):
            key = (table, path.name)
            if key not in self._cache:
                try:
                    self._cache[key] = pq.read_table(path, schema=fmt.SCHEMAS[table])
                except Exception:  # noqa: BLE001 - a damaged chunk is reported, the rest stays usable
                    self.problems.append(str(path))
                    continue
            parts.append(self._cache[key])
        if not parts:
            return fmt.SCHEMAS[table].empty_table()
        return pa.concat_tables(parts)


def _covers(name: str, training_step: int) -> bool:
    first, last = fmt.step_range_of(name)
    return first <= training_step <= last


def _read_metadata(directory: Path) -> dict[str, Any]:
    path = directory / fmt.TRIAL_META
    try:
        metadata = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise StoreError(f"Trial metadata {str(path)!r} is unreadable ({error}).") from error
    version = metadata.get("format_version")
    if not isinstance(version, int) or version > fmt.FORMAT_VERSION:
        raise StoreError(f"Trial {directory.name!r} was written in format_version {version!r}, but this comgra "
                         f"reads up to {fmt.FORMAT_VERSION}. Upgrade comgra: pip install -U comgra")
    return metadata

"""Read a recording: one API for the app, the REST API and users' own scripts.

DuckDB does the filtering; chunk names carry their step range, so a query for
one training step opens only the chunks that can hold it, and rows inside a
chunk are sorted by node so that Parquet statistics let DuckDB skip the rest.
A series across every step reads its node's row groups directly (``series_read``).
Small tables (the step index, KPIs, notes) are cached per chunk file: chunks
are immutable, so a cache entry never goes stale, and a live run's new chunks
are picked up on the next call.

    >>> group = GroupReader("/path/to/root/group")          # doctest: +SKIP
    >>> trial = group.trial(group.trials()[0])              # doctest: +SKIP
    >>> trial.selection(training_step=0, node="input")      # doctest: +SKIP
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from comgra.errors import SelectionError, StoreError, did_you_mean
from comgra.store import format as fmt
from comgra.store import chunk_checks, layout, remote, validation
from comgra.store.duck_connection import ReaderConnection
from comgra.store.series_read import SeriesReader
from comgra.store.small_tables import SmallTables

_TENSORS = fmt.SCHEMAS["tensors"]
log = logging.getLogger("comgra.store")
_SELECTION_FILTERS = ("training_step", "kind", "iteration", "node", "role", "aggregation", "sample", "rank",
                      "type_of_execution")
_TYPE = "type_of_execution"  # a step is (training_step, type): a row without a type (older chunks) is any type's


class GroupReader:
    """A group folder (``comgra_root_path/group``) with one or more trials."""

    def __init__(self, path: str | Path, *, storage_options: dict[str, Any] | None = None):
        # A URL (s3://, gs://, ...) is read through a local mirror, refreshed once per poll (store.remote).
        self.path, self.mirror = remote.group_folder(path, storage_options)
        if not self.path.is_dir():
            raise StoreError(f"No recording at {str(self.path)!r}: the folder does not exist. "
                             "Pass the group folder, i.e. comgra_root_path/group.")
        self._trials: dict[str, TrialReader] = {}
        self._lock = threading.Lock()

    def trials(self) -> list[str]:
        """The trials that have metadata on disk, sorted by name; new trials appear live."""
        remote.poll(self.mirror)
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

    def is_open(self, trial_id: str) -> bool:
        """Whether ``trial()`` has opened this trial and keeps it (with its caches and DuckDB connection)."""
        return trial_id in self._trials

    def forget(self, trial_id: str) -> None:
        """Let go of one opened trial, as ``close`` does of all (a scan of a sweep opens each trial once)."""
        with self._lock:
            self._trials.pop(trial_id, None)

    def chunk_names(self, trial_id: str, table: str) -> list[str]:
        """The chunk names of one table of a trial, without opening the trial (no metadata read): the app's
        poll asks this of every trial every few seconds. A trial that is not a folder of the group has none."""
        remote.poll(self.mirror)
        directory = fmt.trial_dir(self.path, trial_id)
        if "/" in trial_id or trial_id in ("", ".", "..") or not (directory / fmt.TRIAL_META).is_file():
            return []
        # Both layouts (no metadata read): a trial is in one of them, or in both for a moment while it migrates.
        return sorted(name for version in (2, 3) for folder in layout.table_dirs(directory, table, version)
                      for name in fmt.chunk_names(folder))

    def trial(self, trial_id: str) -> TrialReader:
        with self._lock:
            kept = self._trials.get(trial_id)
            if kept is not None and (fmt.folder_identity(kept.directory) != kept.folder or kept.migrated()):
                del self._trials[trial_id]  # a new run took the name (capture.open_recorders), or `comgra migrate`
            if trial_id not in self._trials:
                directory = fmt.trial_dir(self.path, trial_id)
                # This trial's metadata only: listing the group for each trial opened made a sweep's O(trials^2).
                if "/" in trial_id or trial_id in ("", ".", "..") or not (directory / fmt.TRIAL_META).is_file():
                    raise SelectionError(f"No trial {trial_id!r} in {str(self.path)!r}"
                                         + did_you_mean(trial_id, self.trials()))
                if not validation.inside(directory, self.path):
                    raise StoreError(f"Trial {trial_id!r} of {str(self.path)!r} is a link to a folder outside the "
                                     "recording; comgra reads nothing outside it. Copy the trial in instead.")
                self._trials[trial_id] = TrialReader(directory, mirror=self.mirror)
            return self._trials[trial_id]


class TrialReader:
    """One trial. Every method reads only what its answer needs."""

    def __init__(self, directory: Path, *, mirror: remote.Mirror | None = None):
        self.directory = directory
        # A recording at a URL: large chunks are sparse copies, their ranges fetched before they are read (``fetch``).
        self._mirror = mirror
        fill = mirror.fill if mirror is not None else None
        self.folder = fmt.folder_identity(directory)  # what the chunk cache holds is of this folder only
        self.trial_id = directory.name
        self.metadata = validation.read_trial_metadata(directory)
        self.format_version = int(self.metadata.get("format_version", fmt.FORMAT_VERSION))
        self._metadata_file = fmt.folder_identity(directory / fmt.TRIAL_META)
        # Skipped files (damaged, foreign, outside the trial) -> what is wrong; a dict, so each is listed once.
        self._problems: dict[str, str] = {}
        self._still_read: set[str] = set()  # files in ``_problems`` whose good part is read (not skipped)
        self._problems_lock = threading.Lock()  # the app's request threads find damage concurrently
        self._keep_readable_modules()
        self._small = SmallTables(self)  # steps, KPIs, notes, ...: read once per immutable chunk
        self._graphs: dict[str, fmt.GraphDocument] = {}
        self._lock = threading.Lock()
        # Opened on the first query (4 MiB each): a trial only listed or scanned (with pyarrow) never opens one.
        self._duck = ReaderConnection()  # opened again once the footers it keeps of chunks gone pass a size
        self._series_reader = SeriesReader(fill=fill)
        # (path, size, mtime) of a chunk -> its schema passed, and the pages that passed their checksums
        self._checks = chunk_checks.ChunkChecks(fill)

    def migrated(self) -> bool:  # a trial of format 1 or 2 migrated since it was opened (trial.json replaced)
        return self.format_version < 3 and fmt.folder_identity(self.directory / fmt.TRIAL_META) != self._metadata_file

    def _keep_readable_modules(self) -> None:
        """Module trees not of the shape the recorder writes are left out of ``metadata`` and reported, so that
        whoever shows the trees (the app's panel, the REST API) meets only the shape it knows."""
        trees = self.metadata.get("modules") or []
        readable = []
        for index, tree in enumerate(trees):
            problem = validation.module_tree_problem(tree)
            if problem is None:
                readable.append(tree)
            else:
                self._report_problem(self.directory / fmt.TRIAL_META,
                                     f"its modules entry {index} is not a module tree ({problem}); left out")
        if len(readable) != len(trees):
            self.metadata = {**self.metadata, "modules": readable}

    # -- ranks of a torch.distributed run ---------------------------------------------------------
    def ranks(self) -> list[int]:
        """The ranks that wrote chunks into this trial, sorted: ``[0]`` for a single-process run.

        Every method that returns rows takes ``rank``: None means all ranks (tell them apart by
        the ``rank`` column), an int the rows of that rank only.
        """
        return sorted({layout.rank_of_chunk(p) for table in ("steps", "tensors") for p in self._files(table)})

    def chunk_names(self, table: str) -> list[str]:
        """The names of a table's chunk files, sorted: a version token (a new chunk changes it), one scandir."""
        return [path.name for path in self.chunk_paths(table)]

    def chunk_paths(self, table: str) -> list[Path]:
        """Every chunk file of a table (merged-away parts too, until deleted), sorted by name."""
        folders = layout.table_dirs(self.directory, table, self.format_version)
        return sorted((folder / name for folder in folders for name in fmt.chunk_names(folder)), key=lambda p: p.name)

    # -- small tables, cached per immutable chunk --------------------------------------------
    def steps(self, rank: int | None = None) -> pa.Table:
        """One row per (rank, training_step, iteration), sorted: the index of everything recorded."""
        return self._small.table("steps", rank).sort_by(
            [("training_step", "ascending"), ("iteration", "ascending"), ("rank", "ascending")])

    def kpis(self, rank: int | None = None) -> pa.Table:
        return self._small.table("kpis", rank).sort_by(
            [("kpi_group", "ascending"), ("timepoint", "ascending"), ("rank", "ascending")])

    def notes(self, rank: int | None = None) -> list[str]:
        table = self._small.table("notes", rank).sort_by(
            [("wall_time", "ascending"), ("rank", "ascending"), ("seq", "ascending")])
        return table.column("note").to_pylist()

    def layers(self, rank: int | None = None) -> pa.Table:
        """Per-layer profiling rows (one per execution of a module), sorted by step, module and call."""
        return self._small.table("layers", rank).sort_by(
            [("training_step", "ascending"), ("module", "ascending"), ("call", "ascending"), ("rank", "ascending")])

    def resources(self, rank: int | None = None) -> pa.Table:
        """Resource samples over time (long format: wall_time, source, metric, value)."""
        return self._small.table("resources", rank).sort_by(
            [("wall_time", "ascending"), ("source", "ascending"), ("metric", "ascending")])

    def evidence(self, table: str, rank: int | None = None) -> pa.Table:
        """The rows of ``runinfo`` or ``sentinels`` (format.RUNINFO_SCHEMA, SENTINELS_SCHEMA), sorted by step and rank."""
        if table not in ("runinfo", "sentinels"):
            raise SelectionError(f"No evidence table {table!r}" + did_you_mean(table, ["runinfo", "sentinels"]))
        return self._small.table(table, rank).sort_by([("training_step", "ascending"), ("rank", "ascending")])

    def graph(self, graph_hash: str) -> fmt.GraphDocument:
        """The dependency graph of one iteration (see the README for its fields), once its fields are checked."""
        if graph_hash not in self._graphs:
            # The hash comes from a file: only the writer's shape may become a path (no "../..").
            path = self.directory / "graphs" / f"{validation.check_graph_hash(graph_hash, self.trial_id)}.json"
            if path.exists() and not validation.inside(path, self.directory):
                raise StoreError(f"Graph {str(path)!r} is a link to a file outside trial {self.trial_id!r}; "
                                 "comgra reads nothing outside the recording.")
            try:
                document = validation.load_json(path, "Graph")
            except StoreError as error:
                raise StoreError(f"{error} The recording may still be in progress or was damaged.") from None
            self._graphs[graph_hash] = cast(fmt.GraphDocument, validation.check_graph(document, path))
        return self._graphs[graph_hash]

    @property
    def problems(self) -> list[str]:
        """The files that were skipped (damaged, foreign, or outside the trial), each once, oldest first."""
        with self._problems_lock:
            return list(self._problems)

    def problem_reasons(self) -> dict[str, str]:
        """``problems`` with what is wrong with each file, for messages."""
        with self._problems_lock:
            return dict(self._problems)

    def _report_problem(self, path: Path, reason: str, *, skipped: bool = True) -> None:
        """List ``path`` in ``problems``; ``skipped=False`` for a file whose good part is still read (its
        repeated rows left out): it stays in the listing of its table."""
        with self._problems_lock:
            self._problems.setdefault(str(path), reason)
            if not skipped:
                self._still_read.add(str(path))

    report_problem = _report_problem  # for what a reader outside this class skipped (a damaged resources document)

    def fetch(self, path: Path, row_groups: Iterable[int] | None = None, columns: Iterable[str] | None = None) -> None:
        """Before reading a tensors chunk with pyarrow yourself: bring ``row_groups`` x ``columns`` (None: all) of a URL's."""
        if self._mirror is not None:
            self._mirror.fill(path, row_groups, columns)

    # -- tensor values -------------------------------------------------------------------------
    def selection(self, *, training_step: int, columns: list[str] | None = None, **filters: Any) -> pa.Table:
        """Rows of one training step, filtered by any of kind, iteration, node, role, aggregation, sample, rank and
        type_of_execution (an evaluation may share a training step's number). Cost grows with the rows returned."""
        unknown = set(filters) - set(_SELECTION_FILTERS)
        if unknown:
            raise SelectionError(f"Unknown filter(s) {sorted(unknown)}; valid filters: {list(_SELECTION_FILTERS)}")
        validation.check_filter_values({k: v for k, v in {"training_step": training_step, **filters}.items() if v is not None})
        typed = filters.get(_TYPE)  # a step of another type at this number only: no rows
        held = typed is None or bool(pc.any(pc.equal(self._numbers_of(typed, None), training_step)).as_py())
        files = [p for p in self._files("tensors", filters.get("rank")) if held and _covers(p.name, training_step)]
        return self._query(files, columns, {"training_step": training_step, **filters})

    def _numbers_of(self, type_of_execution: str, rank: int | None) -> pa.Array:
        """The step numbers of one type: a row of a chunk older than the type column (null) is its number's one step's."""
        steps = self.steps(rank)
        return pc.filter(steps["training_step"], pc.equal(steps[_TYPE], type_of_execution)).combine_chunks()

    def steps_selection(self, training_steps: list[int], *, rank: int | None = None,
                        type_of_execution: str | None = None) -> pa.Table:
        """Every row of several training steps in one read (a chunk is sorted by series, so one step's rows lie in
        all its row groups: reading the neighbouring steps of the same chunks costs about what one step does)."""
        steps = sorted({int(s) for s in training_steps})
        files = [p for p in self._files("tensors", rank) if any(_covers(p.name, s) for s in steps)]
        return self._query(files, None, {"training_step": steps, "rank": rank, _TYPE: type_of_execution})

    def series(self, *, node: str, role: str, kind: str = fmt.FORWARD, iteration: int | None,
               aggregation: str = "mean", sample: int = -1, statistic: str = "mean", rank: int | None = None,
               cancelled: Callable[[], bool] | None = None, type_of_execution: str | None = None) -> pa.Table:
        """One statistic of one tensor across every recorded step: columns training_step, value, rank,
        sorted by rank, then step (``rank=None``: every rank's line; ``iteration=None``: a row per recorded iteration
        of each step, in no set order; ``type_of_execution``: its steps only). ``cancelled()``, asked between chunks,
        ends the read with ``series_read.ReadCancelled`` once it is true."""
        if statistic not in fmt.STATISTICS + ("svd_max",):
            raise SelectionError(f"Unknown statistic {statistic!r}" + did_you_mean(statistic, fmt.STATISTICS))
        filters = {"node": node, "role": role, "kind": kind, "iteration": iteration,
                   "aggregation": aggregation, "sample": sample, "rank": rank, _TYPE: type_of_execution}
        table = self._series_rows(self._files("tensors", rank), ["training_step", statistic, "rank"], filters,
                                  cancelled)
        if type_of_execution is not None:
            table = table.filter(pc.is_in(table["training_step"], self._numbers_of(type_of_execution, rank)))
        return table.rename_columns(["training_step", "value", "rank"]).sort_by(
            [("rank", "ascending"), ("training_step", "ascending")])

    def values_series(self, *, node: str, role: str, kind: str = fmt.FORWARD, iteration: int,
                      aggregation: str = "sample", sample: int | None = None, rank: int | None = None) -> pa.Table:
        """Stored values of a tensor at every recorded step: training_step, sample, neurons, rank (sorted)."""
        filters = {"node": node, "role": role, "kind": kind, "iteration": iteration,
                   "aggregation": aggregation, "sample": sample, "rank": rank}
        table = self._series_rows(self._files("tensors", rank), ["training_step", "sample", "neurons", "rank"], filters)
        return table.sort_by([("rank", "ascending"), ("training_step", "ascending"), ("sample", "ascending")])

    def _series_rows(self, files: list[Path], columns: list[str], filters: dict[str, Any],
                     cancelled: Callable[[], bool] | None = None) -> pa.Table:
        """Only the row groups that can hold the node (see ``series_read``). A damaged chunk, or one merged
        away meanwhile, sends the read through DuckDB's route, which finds and reports it, or lists again."""
        if self._format_1:  # format 1 has no rank column
            return self._query(files, columns, filters)
        validation.check_filter_values({k: v for k, v in filters.items() if v is not None})
        # Schema and key columns, once per chunk version; one merged away meanwhile stays: the read lists again.
        files = [p for p in files if self.has_tensor_schema(p) or not p.exists()]
        self._series_reader.forget_all_but(files if filters["rank"] is None else self._files("tensors"))
        try:
            return self._series_reader.read(files, columns, filters, _TENSORS.empty_table().select(columns),
                                            cancelled)
        except (OSError, ValueError, pa.ArrowException) as error:  # a failing checksum or schema too
            log.debug("comgra: series read through DuckDB after %r", error)
            return self._query(files, columns, filters)

    def tensor_chunks(self, rank: int | None = None) -> list[Path]:
        """The visible tensors chunks (a merged chunk hides its parts), sorted: for a scan that reads each once."""
        return self._files("tensors", rank)

    def has_tensor_schema(self, path: Path) -> bool:
        """Whether a tensors chunk has the table's columns and types (from its footer, once per chunk version); one
        that does not is listed in ``problems``. For callers that read a chunk with pyarrow themselves."""
        try:
            self._verify("tensors", path, frozenset())
        except FileNotFoundError:
            return False
        except Exception as error:  # noqa: BLE001 - any failure to parse means the chunk is unusable
            self._report_problem(path, chunk_checks.damage_reason(error))
            return False
        return True

    def _has_type(self, path: Path) -> bool:
        try:
            return self.format_version >= 3 and _TYPE in self._checks.names_of(path)
        except OSError:
            return True  # merged away meanwhile: the query fails and lists again

    def read_tensor_chunk(self, path: Path, columns: list[str] | None = None) -> pa.Table:
        """Every row of one tensors chunk; a damaged one is listed in ``problems`` and reads as empty,
        and so does one a live writer merged away meanwhile (its rows are in the merged chunk)."""
        wanted = list(columns or _TENSORS.names)
        empty = _TENSORS.empty_table().select(wanted)
        if str(path) in self.problems or not self.has_tensor_schema(path):
            return empty
        try:
            # Read by pyarrow, every page checked as it is decoded: one pass, where DuckDB's route would check
            # the pages first and then decode them again.
            self.fetch(path)
            with pq.ParquetFile(path, page_checksum_verification=True) as parquet:
                table = parquet.read(columns=[c for c in wanted if c in parquet.schema_arrow.names])
        except FileNotFoundError:
            return empty  # merged away meanwhile: its rows are in the merged chunk
        except Exception as error:  # noqa: BLE001 - any failure to decode means the chunk is unusable
            self._report_problem(path, chunk_checks.damage_reason(error))
            log.debug("comgra: skipped %s", path, exc_info=error)
            return empty
        table = fmt.with_added_columns("tensors", table)  # a chunk older than the type column: nulls
        if "rank" in wanted and "rank" not in table.column_names:  # format 1: rank 0's; format 3: its folder's
            rank = layout.rank_of_chunk(path)
            table = table.append_column(fmt.RANK_FIELD, pa.array(np.full(table.num_rows, rank, np.int32)))
        return table.select(wanted)

    def _query(self, files: list[Path], columns: list[str] | None, filters: dict[str, Any]) -> pa.Table:
        active = {k: v for k, v in filters.items() if v is not None}
        validation.check_filter_values(active, sets=True)  # before DuckDB: a value it cannot bind must not look like a damaged chunk
        # DuckDB checks no page checksums: every column it reads or filters on is checked here first, once per chunk.
        files = self._verified("tensors", files, [*(columns or _TENSORS.names), *active], active.get("node"))
        if not files:
            return _TENSORS.empty_table().select(columns or _TENSORS.names)
        # A list is a set of values (steps read together); the parameters are its items, one each.
        where = " AND ".join(f'"{k}" IN ({", ".join("?" * len(v))})' if isinstance(v, list) else
                             f'("{k}" = ? OR "{k}" IS NULL)' if k == _TYPE else f'"{k}" = ?'
                             for k, v in active.items()) or "TRUE"
        values = [item for v in active.values() for item in (v if isinstance(v, list) else [v])]
        select = ", ".join(f'"{c}"' for c in columns) if columns else "*"

        def run(paths: list[Path]) -> pa.Table:
            groups: dict[tuple[int | None, bool], list[str]] = {}  # format 3: by rank (a constant) and type column
            for p in paths:  # a trial named "run*" is no pattern
                key = (layout.rank_of_chunk(p) if self.format_version >= 3 else None, self._has_type(p))
                groups.setdefault(key, []).append(validation.glob_escaped(p))
            sql = f"SELECT {select} FROM {self._tensors_source(list(groups))} WHERE {where}"
            self._duck.reading(paths)
            return self._duck.cursor().sql(sql, params=[*groups.values(), *values]).to_arrow_table()

        try:
            return run(files)
        except duckdb.Error:
            if not all(p.exists() for p in files):  # merged away by a live writer meanwhile: list again
                return self._query(self._refreshed(files), columns, filters)
            if not self._drop_corrupt(files, run):
                return _TENSORS.empty_table().select(columns or _TENSORS.names)
            return self._query([p for p in files if str(p) not in self.problems], columns, filters)

    def _tensors_source(self, groups: list[tuple[int | None, bool]]) -> str:
        """Format 1 has no rank column (its rows are rank 0's), format 3 names it by folder: a constant stands in for it,
        one ``read_parquet`` per rank, Hive detection off (it would add ``trial`` and a second ``rank`` column). A chunk
        older than the type column reads it as null, one group per (rank, has the column)."""
        null_type = f'CAST(NULL AS VARCHAR) AS "{_TYPE}", '
        if self.format_version >= 3:
            read = 'SELECT *, {}CAST({} AS INTEGER) AS "rank" FROM read_parquet(?, hive_partitioning = false)'
            return "(" + " UNION ALL ".join(read.format("" if typed else null_type, int(r or 0))
                                            for r, typed in groups) + ")"
        if self.format_version >= 2:
            return f'(SELECT * EXCLUDE ("rank"), {null_type}"rank" FROM read_parquet(?))'
        return f'(SELECT *, {null_type}CAST(0 AS INTEGER) AS "rank" FROM read_parquet(?))'

    # -- files -------------------------------------------------------------------------------------
    def _files(self, table: str, rank: int | None = None) -> list[Path]:
        """The visible chunks of ``table``; with ``rank``, only those that rank wrote (by name: no file opened)."""
        bad = self._skipped()
        folders = layout.table_dirs(self.directory, table, self.format_version)
        visible = [p for folder in folders for p in fmt.visible_chunks(self._own_chunks(folder, bad))]
        if table == "tensors":
            self._duck.listed(visible)  # what DuckDB keeps of chunks merged away is bounded
        return visible if rank is None else [p for p in visible if layout.rank_of_chunk(p) == rank]

    def _own_chunks(self, folder: Path, bad: set[str], attempts: int = 8) -> list[Path]:
        """The listed chunks that may be opened; one gone since (merged away) makes the listing stale: list again."""
        inside = self.directory if self.format_version < 3 else folder.parent  # format 3: GROUP/<table>/trial=<id>/
        for _ in range(attempts):
            own, stale = [], False
            for path in (p for p in fmt.settled_chunk_files(folder) if str(p) not in bad):
                problem = chunk_checks.not_own_chunk(path, inside)
                stale = stale or problem == ""
                if problem:
                    self._report_problem(path, problem)
                elif problem is None:
                    own.append(path)
            if not stale:
                break
        return own

    def _verified(self, table: str, files: list[Path], columns: Iterable[str] | None = None,
                  node: Any = None) -> list[Path]:
        """``files`` less the chunks whose schema is not ``table``'s or whose pages of ``columns`` (None: all) fail
        their checksums; those are reported. With ``node`` (a tensors query for one node), only the row groups that
        can hold it are checked: those DuckDB reads. What passed is kept per chunk version (chunks are immutable), so
        a page is checked once per process, not on every query."""
        wanted = frozenset(columns or fmt.SCHEMAS[table].names)
        good = []
        for path in files:
            try:
                self._verify(table, path, wanted, node if isinstance(node, str) else None)
            except FileNotFoundError:
                pass  # merged away meanwhile: the query lists again
            except Exception as error:  # noqa: BLE001 - any failure to decode means the chunk is unusable
                self._report_problem(path, chunk_checks.damage_reason(error))
                log.debug("comgra: skipped %s", path, exc_info=error)
                continue
            good.append(path)
        return good

    def _verify(self, table: str, path: Path, wanted: frozenset[str], node: str | None = None) -> None:
        self._checks.verify(table, path, wanted, lambda count: self._row_groups(table, path, node, count),
                            rank_optional=self.format_version != 2)

    def _row_groups(self, table: str, path: Path, node: str | None, count: int) -> list[int]:
        """The row groups a query reads: for one node of a tensors chunk, those its footer's bounds allow."""
        if node is None or table != "tensors" or self._format_1:
            return list(range(count))
        return self._series_reader.row_groups_of(path, node)

    @property
    def _format_1(self) -> bool:
        return self.format_version < 2

    def _refreshed(self, files: list[Path]) -> list[Path]:
        """The current chunks that hold the steps ``files`` held."""
        ranges = [fmt.step_range_of(p.name) for p in files]
        low, high = min(r[0] for r in ranges), max(r[1] for r in ranges)
        ranges_now = [(p, fmt.step_range_of(p.name)) for p in self._files("tensors")]
        return [p for p, (first, last) in ranges_now if first <= high and last >= low]

    def _skipped(self) -> set[str]:
        with self._problems_lock:
            return set(self._problems) - self._still_read

    def _drop_corrupt(self, files: list[Path], run: Callable[[list[Path]], pa.Table]) -> bool:
        """Find the chunks DuckDB could not read, remember them, and say whether any were found."""
        found = False
        for path in files:
            try:
                pq.read_metadata(path)
            except Exception as error:  # noqa: BLE001 - any failure to parse means the chunk is unusable
                self._report_problem(path, "damaged: not a readable Parquet file")
                log.debug("comgra: skipped %s", path, exc_info=error)
                found = True
        if not found:  # an intact footer over damaged pages: only reading the chunk on its own tells
            for path in files:
                try:
                    run([path])
                except duckdb.Error as error:
                    self._report_problem(path, "damaged: its values cannot be read")
                    log.debug("comgra: skipped %s", path, exc_info=error)
                    found = True
        return found


def _covers(name: str, training_step: int) -> bool:
    first, last = fmt.step_range_of(name)
    return first <= training_step <= last

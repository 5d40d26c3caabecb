"""The small tables of a trial (the step index, KPIs, notes, layers, resources, the evidence tables), read once
per immutable chunk: a live run's new chunks are read on the next call, and chunks a writer merged away are let go.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from comgra.store import chunk_checks
from comgra.store import format as fmt



class _Reader(Protocol):
    """What the cache asks of its ``TrialReader``."""

    format_version: int

    def chunk_names(self, table: str) -> list[str]: ...
    def _files(self, table: str, rank: int | None = None) -> list[Path]: ...
    def _report_problem(self, path: Path, reason: str, *, skipped: bool = True) -> None: ...

log = logging.getLogger("comgra.store")
_STALE_LISTING_ATTEMPTS = 8  # a compaction finishes in milliseconds; eight listings in a row cannot all be stale


class SmallTables:
    """The per-chunk cache of one ``TrialReader``; damage is reported through the reader."""

    def __init__(self, reader: _Reader):
        self._reader = reader
        self._cache: dict[tuple[str, str], pa.Table] = {}

    def table(self, table: str, rank: int | None = None) -> pa.Table:
        # A live writer's compaction may remove parts between our listing and our read; their rows are
        # then in a merged chunk that the listing did not have yet. Such a listing is stale: list again.
        # A listing torn by a merge while the folder was read is listed again by the reader's ``_files``
        # (``format.settled_chunk_files``).
        parts: list[pa.Table] = []
        for _ in range(_STALE_LISTING_ATTEMPTS):
            read = self._read_listed(table, rank)
            if read is not None:
                parts = read
                break
        self._forget_merged_away(table)
        if not parts:
            return fmt.SCHEMAS[table].empty_table()
        merged = pa.concat_tables(parts)
        return merged if rank is None else merged.filter(pc.equal(merged["rank"], rank))

    def cached_chunks(self, table: str) -> set[str]:
        """The names of the chunks of ``table`` whose rows are kept now."""
        return {name for kind, name in list(self._cache) if kind == table}

    def _forget_merged_away(self, table: str) -> None:
        """Let go of the chunks of ``table`` no longer on disk: a live writer merges every flush's chunks away,
        and a server that kept them all grew with every chunk the run wrote (one scandir; removal is per key,
        so a request thread adding a chunk meanwhile loses nothing)."""
        on_disk = set(self._reader.chunk_names(table))
        for key in [k for k in list(self._cache) if k[0] == table and k[1] not in on_disk]:
            self._cache.pop(key, None)

    def _read_listed(self, table: str, rank: int | None) -> list[pa.Table] | None:
        """The chunks of one listing of ``table``; None when one of them vanished before it was read."""
        parts = []
        for path in self._reader._files(table, rank):
            key = (table, path.name)  # a chunk's name is unique across ranks: it holds the rank
            kept = self._cache.get(key)  # once: another thread may let go of a chunk merged away meanwhile
            if kept is None:
                try:
                    # Without a rank column a small table's rows are rank 0's (format 1, and tools that write
                    # chunks of the *_SCHEMA the recorder hands its writer), as they always were.
                    version = self._reader.format_version
                    read = chunk_checks.complete(table, chunk_checks.read_small(table, path, version))
                    kept = self._cache[key] = self._each_step_once(path, read) if table == "steps" else read
                except Exception as error:  # noqa: BLE001 - a damaged chunk is reported, the rest stays usable
                    if not path.exists():
                        return None  # merged away meanwhile
                    reason = chunk_checks.damage_reason(error, "damaged, or not a comgra chunk of this table")
                    self._reader._report_problem(path, reason)
                    log.debug("comgra: skipped %s", path, exc_info=error)
                    continue
            parts.append(kept)
        return parts

    def _each_step_once(self, path: Path, table: pa.Table) -> pa.Table:
        """A steps chunk with each step once (see ``chunk_checks.each_step_once``); a repeat is reported, and the
        chunk stays in the listing: its rows are read, each once, on every call."""
        table, twice = chunk_checks.each_step_once(table)
        if twice:
            self._reader._report_problem(
                path, f"holds {twice} row(s) of the step index twice; each step is listed once", skipped=False)
        return table

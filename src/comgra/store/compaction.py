"""Compaction of a finished trial: one Parquet file per table and rank (more only past ``TARGET_BYTES``).

A run's writer flushes every few seconds and merges its flushes in tiers (``writer.ChunkWriter._merge``), which
leaves a finished 10-step trial with one file per table and flush. Object stores, Dask (a partition per file)
and every engine's planner pay per file, so at ``finalize`` the writer rewrites each table of its rank into one
file, and ``comgra compact GROUP`` does the same for recordings made before.

Safe as the writer's merges are: the merged file is written under a temporary name, made durable and renamed
into place with a higher merge level and sequence number than its parts, and only then are the parts deleted.
Between the two, comgra's reader sees the merged file hide its parts (``format.visible_chunks``); after a crash
there, ``comgra repair`` (or the next writer of the rank) deletes the covered parts.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from comgra.store import format as fmt
from comgra.store import layout
from comgra.store.encoding import _read_part, _write_chunk

# A compacted file holds about this many bytes (as its parts take on disk) at most: big enough that a long run
# is a few files, small enough that an engine reads it in parallel row groups and a rewrite fits in memory.
TARGET_BYTES = 128 << 20


@dataclass
class PartitionCompaction:
    """What compaction did to one table of one rank."""

    table: str
    rank: int
    before: int = 0  # visible chunks before
    after: int = 0
    skipped: str = ""  # why it was left as it is


@dataclass
class TrialCompaction:
    trial_id: str
    partitions: list[PartitionCompaction] = field(default_factory=list)
    skipped_live: bool = False

    def describe(self) -> str:
        if self.skipped_live:
            return f"{self.trial_id}: skipped, a writer is recording it now"
        before = sum(p.before for p in self.partitions)
        after = sum(p.after for p in self.partitions)
        notes = "".join(f"; {p.table} of rank {p.rank} left as it is: {p.skipped}" for p in self.partitions
                        if p.skipped)
        return f"{self.trial_id}: {before} file(s) -> {after}{notes}"


def compact_folder(folder: Path, table: str, *, target_bytes: int = TARGET_BYTES,
                   check: Callable[[], None] | None = None) -> PartitionCompaction:
    """Rewrite the visible chunks of one rank's folder of one table (format 3) into as few files as
    ``target_bytes`` allows. ``check()`` is called before each file is renamed into place (the writer's check that
    its trial folder is still its own)."""
    rank = layout.rank_of_folder(folder)
    report = PartitionCompaction(table, rank if rank is not None else 0)
    chunks = fmt.visible_chunks(fmt.chunk_files(folder))
    report.before = report.after = len(chunks)
    if len(chunks) < 2:
        return report
    parsed = {path: fmt.parse_chunk_name(path.name) for path in chunks}
    level = max(c.level for c in parsed.values() if c is not None) + 1
    seq = max(fmt.seq_of(p.name) for p in fmt.chunk_files(folder)) + 1
    batches = _batches(chunks, parsed, target_bytes)
    tables: list[pa.Table | None] = []
    for batch in batches:
        if len(batch) < 2:
            tables.append(None)
            continue
        merged = pa.concat_tables([fmt.with_added_columns(table, _read_part(p)) for p in batch])
        if merged.schema.names != fmt.FILE_SCHEMAS[table].names:
            report.skipped = "its chunks are not all of format 3"
            return report
        if table == "steps" and _repeats_a_step(merged):
            # A run resumed into the trial recorded these steps again: its chunks stay apart (the reader keeps
            # both records, and reports a step listed twice within one chunk as damage).
            report.skipped = "a step is recorded in more than one chunk (a resumed run)"
            return report
        tables.append(merged.cast(fmt.FILE_SCHEMAS[table]))
    report.after = 0
    for batch, merged in zip(batches, tables):
        if merged is None:
            report.after += len(batch)
            continue
        first = min(parsed[p].first for p in batch)  # type: ignore[union-attr]
        last = max(parsed[p].last for p in batch)  # type: ignore[union-attr]
        if check is not None:
            check()
        path = folder / fmt.chunk_name(seq, first, last, report.rank, level)
        seq += 1
        _write_chunk(table, path, merged)
        for part in batch:  # after the merged file is in place: see format.visible_chunks
            part.unlink(missing_ok=True)
        report.after += 1
    return report


def _batches(chunks: list[Path], parsed: dict[Path, Any], target_bytes: int) -> list[list[Path]]:
    """Chunks in step order, cut into runs of about ``target_bytes``. A cut is made only between chunks whose step
    ranges do not overlap: a merged file hides every older chunk inside its range, so one run's file must never
    span a chunk of another run."""
    ordered = sorted(chunks, key=lambda p: (parsed[p].first, parsed[p].last, parsed[p].seq))
    batches: list[list[Path]] = [[]]
    size, reach = 0, -1
    for path in ordered:
        chunk = parsed[path]
        length = _size(path)
        if batches[-1] and size + length > target_bytes and chunk.first > reach:
            batches.append([])
            size = 0
        batches[-1].append(path)
        size += length
        reach = max(reach, chunk.last)
    return batches


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _repeats_a_step(steps: pa.Table) -> bool:
    keys = set(zip(steps["training_step"].to_pylist(), steps["type_of_execution"].to_pylist(),
                   steps["iteration"].to_pylist()))
    return len(keys) != steps.num_rows

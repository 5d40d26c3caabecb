"""``comgra migrate``: rewrite a recording of format 1 or 2 as format 3, trial by trial, safely.

Per trial, with every rank's writer lock held (a trial being recorded is skipped):

1. debris of an earlier, interrupted migration of the trial (its format-3 table folders) is removed;
2. each table's visible chunks are read (pages checked) and written as format-3 files, one per rank and
   about ``compaction.TARGET_BYTES`` (``GROUP/<table>/trial=<id>/rank=<r>/``: no rank column, renamed columns);
3. ``trial.json`` (and each ``rank-NNN.json``) is rewritten with ``format_version`` 3, atomically: the commit;
4. the old chunks are deleted (a chunk that could not be read stays where it was, and is reported).

A crash before 3 leaves the trial in its old format, read as before (the new folders are ignored and removed by
the next run); a crash after it leaves a format-3 trial whose old folders the reader ignores and the next run
deletes. ``comgra compact`` migrates an old trial the same way, and compacts a format-3 one.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from comgra.store import chunk_checks, compaction, layout
from comgra.store import format as fmt
from comgra.store.encoding import _write_chunk

__all__ = ["TrialMigration", "migrate_group", "migrate_trial", "compact_group"]


@dataclass
class TrialMigration:
    """What ``migrate_trial`` did to one trial."""

    trial_id: str
    from_version: int = 0
    files_before: int = 0
    files_after: int = 0
    unreadable: list[str] = field(default_factory=list)  # chunks left where they were
    skipped_live: bool = False
    compacted: compaction.TrialCompaction | None = None

    def describe(self) -> str:
        if self.skipped_live:
            return f"{self.trial_id}: skipped, a writer is recording it now"
        if self.from_version >= 3:
            return self.compacted.describe() if self.compacted else f"{self.trial_id}: already format 3"
        unreadable = f"; {len(self.unreadable)} unreadable chunk(s) left as they were: {self.unreadable}" \
            if self.unreadable else ""
        return (f"{self.trial_id}: format {self.from_version} -> {fmt.FORMAT_VERSION}, "
                f"{self.files_before} file(s) -> {self.files_after}{unreadable}")


def _trials(group_dir: Path) -> list[Path]:
    root = group_dir / fmt.TRIALS_DIR
    if not root.is_dir():
        return []
    return [d for d in sorted(root.iterdir()) if d.is_dir() and not d.is_symlink() and (d / fmt.TRIAL_META).is_file()]


def migrate_group(group_dir: Path) -> list[TrialMigration]:
    """Migrate every trial of a group (format-3 trials are compacted, and left over old folders removed)."""
    return [migrate_trial(d) for d in _trials(group_dir)]


def compact_group(group_dir: Path, target_bytes: int = compaction.TARGET_BYTES) -> list[TrialMigration]:
    """``comgra compact``: one file per table and rank for every finished trial (old trials are migrated)."""
    return [migrate_trial(d, target_bytes=target_bytes) for d in _trials(group_dir)]


@contextmanager
def writer_locks(trial_directory: Path) -> Iterator[bool]:
    """Hold every rank's writer lock of the trial (True), or none where a writer is alive (False)."""
    held: list[int] = []
    try:
        for lock in sorted(trial_directory.glob(".writer-r*.lock")):
            descriptor = os.open(lock, os.O_RDWR)
            held.append(descriptor)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
        yield True
    finally:
        for descriptor in held:
            os.close(descriptor)


def migrate_trial(trial_directory: Path, *, target_bytes: int = compaction.TARGET_BYTES) -> TrialMigration:
    report = TrialMigration(trial_directory.name)
    with writer_locks(trial_directory) as free:
        if not free:
            report.skipped_live = True
            return report
        metadata = json.loads((trial_directory / fmt.TRIAL_META).read_text())
        report.from_version = int(metadata.get("format_version", 1))
        if report.from_version >= 3:
            _remove_old_chunks(trial_directory, keep=set())  # what an interrupted migration left
            report.compacted = compaction.TrialCompaction(trial_directory.name)
            for table in fmt.TABLES:
                for folder in layout.table_dirs(trial_directory, table, 3):
                    report.compacted.partitions.append(
                        compaction.compact_folder(folder, table, target_bytes=target_bytes))
            return report
        group = layout.group_of(trial_directory)
        for folder in layout.trial_partitions(group, trial_directory.name):
            if folder.parent.name in fmt.TABLES:
                shutil.rmtree(folder)  # an interrupted migration's: the trial is still in its old format
        unreadable: set[Path] = set()
        for table in fmt.TABLES:
            chunks = fmt.visible_chunks(fmt.chunk_files(trial_directory / table))
            report.files_before += len(chunks)
            report.files_after += _migrate_table(trial_directory, table, chunks, unreadable, target_bytes)
        report.unreadable = sorted(layout.chunk_label(p) for p in unreadable)
        # The commit: from here on the trial is format 3 (the lead's trial.json decides; the ranks' own follow).
        for name in [fmt.TRIAL_META, *sorted(p.name for p in trial_directory.glob("rank-*.json"))]:
            document = json.loads((trial_directory / name).read_text())
            document["format_version"] = fmt.FORMAT_VERSION
            fmt.write_json_atomic(trial_directory / name, document)
        _remove_old_chunks(trial_directory, keep=unreadable)
    return report


def _migrate_table(trial_directory: Path, table: str, chunks: list[Path], unreadable: set[Path],
                   target_bytes: int) -> int:
    """Write ``chunks`` (of format 1 or 2) as format-3 files; returns how many were written."""
    parsed = {p: fmt.parse_chunk_name(p.name) for p in chunks}
    written = 0  # also each file's sequence number: unique, and all of level 0 (none hides another)
    for batch in compaction._batches(chunks, parsed, target_bytes):
        parts = []
        for path in batch:
            try:
                parts.append(chunk_checks.complete(table, chunk_checks.read_small(table, path, 2)))
            except Exception:  # noqa: BLE001 - a damaged chunk stays where it is, and is reported
                unreadable.add(path)
        if not parts:
            continue
        rows = pa.concat_tables(parts)
        # A step recorded in two chunks (a resumed run): one file per chunk keeps both, as the reader expects.
        repeated = table == "steps" and chunk_checks.first_rows(rows, chunk_checks.STEP_KEY) is not None
        for rows in (parts if repeated else [rows]):
            for rank in sorted(set(rows["rank"].to_pylist())):
                mine = rows.filter(pc.equal(rows["rank"], rank))
                first, last = _range(table, mine)
                folder = layout.rank_dir(trial_directory, table, rank)
                _write_chunk(table, folder / fmt.chunk_name(written, first, last, rank), layout.to_file(table, mine))
                written += 1
    return written


def _range(table: str, rows: pa.Table) -> tuple[int, int]:
    column = "timepoint" if table == "kpis" else "training_step" if "training_step" in rows.column_names else None
    if column is None or rows.num_rows == 0:
        return 0, 0
    bounds = pc.min_max(rows[column])
    return max(0, bounds["min"].as_py()), max(0, bounds["max"].as_py())


def _remove_old_chunks(trial_directory: Path, keep: set[Path]) -> None:
    """The chunks (and temporaries) of the old layout, ``keep`` aside; an old table folder left empty goes too."""
    for table in fmt.TABLES:
        folder = trial_directory / table
        if not folder.is_dir() or folder.is_symlink():
            continue
        for path in folder.iterdir():
            if path not in keep and (fmt.is_chunk_name(path.name) or fmt.is_temporary(path.name)) and path.is_file():
                path.unlink(missing_ok=True)
        if not any(folder.iterdir()):
            folder.rmdir()

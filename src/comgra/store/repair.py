"""Make a closed or crashed recording exact for plain Parquet readers.

A writer killed at the wrong moment can leave two kinds of debris: temporary
files (``.tmp-*.partial``, never matched by ``*.parquet`` but taking space) and
the parts of a merge that was renamed into place just before the kill (a plain
``read_parquet('tensors/*.parquet')`` would count their rows twice; comgra's
reader already hides them). Repair removes both. It never touches the files of
a rank whose writer is alive: that writer holds an exclusive ``flock`` on its
lock file (see ``format.writer_lock_path``).
"""
from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, field
from pathlib import Path

from comgra.store import format as fmt
from comgra.store import layout

__all__ = ["TrialRepair", "repair_group", "repair_trial", "writer_is_alive"]


@dataclass
class TrialRepair:
    """What repair did to one trial."""

    trial_id: str
    temporary_removed: list[str] = field(default_factory=list)  # paths relative to the trial folder
    covered_removed: list[str] = field(default_factory=list)  # parts already merged into a bigger chunk
    skipped_live: bool = False  # a writer of this trial is alive: nothing was touched

    @property
    def fixed(self) -> int:
        return len(self.temporary_removed) + len(self.covered_removed)

    def describe(self) -> str:
        if self.skipped_live:
            return f"{self.trial_id}: skipped, a writer is recording it now"
        if not self.fixed:
            return f"{self.trial_id}: nothing to repair"
        return (f"{self.trial_id}: removed {len(self.temporary_removed)} temporary file(s) and "
                f"{len(self.covered_removed)} chunk(s) already merged into another")


def repair_group(group_dir: Path) -> list[TrialRepair]:
    """Repair every trial of ``group_dir`` (the folder that holds ``trials/``)."""
    trials = group_dir / fmt.TRIALS_DIR
    if not trials.is_dir():
        return []
    return [repair_trial(d) for d in sorted(trials.iterdir()) if d.is_dir() and not d.is_symlink()]


def repair_trial(trial_directory: Path, *, rank: int | None = None) -> TrialRepair:
    """Repair one trial; with ``rank``, only that rank's files (its writer, the caller, holds the lock)."""
    report = TrialRepair(trial_directory.name)
    if rank is None and _any_writer_alive(trial_directory):
        report.skipped_live = True
        return report
    # Both layouts: format 3's folders per table and rank (GROUP/<table>/trial=<id>/rank=<r>/), and the trial's own
    # table folders of formats 1 and 2. Tables comgra does not know are never touched.
    tables = {table: [folder for version in (2, 3) for folder in layout.table_dirs(trial_directory, table, version)
                      if rank is None or version < 3 or layout.rank_of_folder(folder) == rank]
              for table in fmt.TABLES}
    for folder in [trial_directory, trial_directory / "graphs", *(f for folders in tables.values() for f in folders)]:
        if folder.is_dir() and not folder.is_symlink():
            _remove_temporary(folder, trial_directory, rank, report)
    for folders in tables.values():
        for folder in folders:
            _remove_covered(folder, trial_directory, rank, report)
    return report


def writer_is_alive(lock_path: Path) -> bool:
    """True while some process (this one included) holds the lock."""
    try:
        descriptor = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return False  # no lock file: no writer of this version ever ran, or the folder went away
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)  # closing also releases a lock we took
    return False


def _any_writer_alive(trial_directory: Path) -> bool:
    return any(writer_is_alive(p) for p in trial_directory.glob(".writer-r*.lock"))


def _remove_temporary(folder: Path, trial_directory: Path, rank: int | None, report: TrialRepair) -> None:
    for path in folder.iterdir():
        if not fmt.is_temporary(path.name) or not path.is_file():
            continue
        if rank is not None and fmt.rank_of(fmt.final_name_of_temporary(path.name)) != rank:
            continue  # another rank's file, or a JSON document any rank may be writing
        path.unlink(missing_ok=True)
        report.temporary_removed.append(_relative(path, trial_directory))


def _remove_covered(folder: Path, trial_directory: Path, rank: int | None, report: TrialRepair) -> None:
    if folder.is_symlink():
        return  # repair never reaches outside the recording
    # Only files named as the writer names chunks are ever deleted (a user's own file never is).
    chunks = [p for p in fmt.chunk_files(folder) if fmt.is_chunk_name(p.name)]
    visible = set(fmt.visible_chunks(chunks))
    for path in chunks:
        if path in visible or (rank is not None and fmt.rank_of(path.name) != rank):
            continue
        path.unlink(missing_ok=True)
        report.covered_removed.append(_relative(path, trial_directory))


def _relative(path: Path, trial_directory: Path) -> str:
    """A path as the report names it: relative to the trial folder, or to the group (format 3's table folders)."""
    for base in (trial_directory, layout.group_of(trial_directory)):
        if path.is_relative_to(base):
            return str(path.relative_to(base))
    return str(path)


"""Which trials of a group changed since the last look, at the cost of the changes, not of the trials.

The app polls every few seconds; a sweep has thousands of trials, almost all of them finished. Listing
every trial's chunks on each poll (three listings per trial) made a poll, and the app's start-up, grow
with the group. A poll here is one listing of the trials folder and a ``stat`` per trial; it probes the writer lock of,
and lists the chunks of, only the trials that can have changed:

- a trial folder that is new, or whose identity (a new run took the id) or modification time changed
  (trial.json, hyperparameters.json and the writer's lock file are replaced or made directly in it);
- a trial whose writer was alive at the last look (it holds the ``flock`` of ``format.writer_lock_path``
  while it runs; its chunks land in sub-folders, which do not touch the trial folder's time). Only such
  trials have their chunks listed (and compared with the last look), so start-up lists no chunks at all.

A trial that no writer holds and whose folder did not change is taken as unchanged. What this misses: a
chunk written into a trial by hand, or removed by ``comgra repair`` after its writer died, shows on the
next change of the folder or after the app is restarted.

    >>> changes = GroupChanges(GroupReader("/path/to/root/group"))   # doctest: +SKIP
    >>> changes.poll()                                               # doctest: +SKIP
    Poll(version='3f2a-1', changed={'trial_a'}, live={'trial_a'})
"""
from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from comgra.store import format as fmt
from comgra.store.reader import GroupReader
from comgra.store.repair import writer_is_alive

WATCHED_TABLES = ("steps", "kpis", "notes")  # what the views redraw from; findings have their own version


@dataclass(frozen=True)
class TrialState:
    folder: tuple[int, int]  # (inode, mtime_ns) of the trial folder
    live: bool  # a writer held the trial at the last look
    chunks: int  # a hash of the chunk names of WATCHED_TABLES (names carry a sequence: a merge changes them too)


@dataclass(frozen=True)
class Poll:
    version: str  # changes whenever a trial appeared, went away or changed; compare, don't parse
    changed: frozenset[str] = field(default_factory=frozenset)  # since the poll before this one
    live: frozenset[str] = field(default_factory=frozenset)  # trials a writer holds now
    states: Mapping[str, TrialState] = field(default_factory=dict)  # every trial now: equal states, same data


class GroupChanges:
    """Change detection over the trials of one group. Thread-safe; each ``poll`` sees the files now."""

    def __init__(self, group: GroupReader):
        self.group = group
        self._states: dict[str, TrialState] = {}
        self._count = 0
        self._prefix = secrets.token_hex(2)  # a version of another process never equals one of this
        self._lock = threading.Lock()
        self.listings = 0  # chunk listings made so far (the benchmark and tests read it)

    def poll(self) -> Poll:
        with self._lock:
            seen = self._folders()
            changed = {t for t in self._states if t not in seen}
            states = {}
            for trial, folder in seen.items():
                before = self._states.get(trial)
                if before is not None and before.folder == folder and not before.live:
                    states[trial] = before
                    continue
                states[trial] = self._look(trial, folder)
                if before is None or states[trial] != before:
                    changed.add(trial)
            self._states = states
            if changed:
                self._count += 1
            live = frozenset(t for t, s in states.items() if s.live)
            return Poll(f"{self._prefix}-{self._count}", frozenset(changed), live, dict(states))

    def _folders(self) -> dict[str, tuple[int, int]]:
        """trial id -> (inode, mtime_ns) of its folder: the one listing of a poll."""
        found: dict[str, tuple[int, int]] = {}
        try:
            entries = list(os.scandir(self.group.path / fmt.TRIALS_DIR))
        except OSError:
            return found
        for entry in entries:
            try:
                if entry.is_dir() and os.path.isfile(os.path.join(entry.path, fmt.TRIAL_META)):
                    status = entry.stat()
                    found[entry.name] = (status.st_ino, status.st_mtime_ns)
            except OSError:
                continue  # went away while we looked
        return found

    def _look(self, trial: str, folder: tuple[int, int]) -> TrialState:
        """A trial that may have changed: its writer probed, its chunks counted only while a writer holds it."""
        live = writer_alive(self.group.path / fmt.TRIALS_DIR / trial)
        if not live:
            return TrialState(folder, False, 0)
        self.listings += 1
        return TrialState(folder, True, hash(tuple(tuple(self.group.chunk_names(trial, t)) for t in WATCHED_TABLES)))


def writer_alive(trial_directory: Path) -> bool:
    """Whether a process holds the lead rank's writer lock of the trial now (it records, or waits at a breakpoint).
    One ``open`` and ``flock``, no listing; a run that records none of rank 0 is seen through its folder only."""
    return writer_is_alive(fmt.writer_lock_path(trial_directory, 0))

"""The upload journal of a spool folder (``<spool>/.comgra-upload/<digest of the URL>.log``): see store.uploader.

One line per claim (P), upload (U) and remote delete (D) of a file: ``op size mtime pid host key``, appended under a
shared lock in whole lines, rewritten (``Journal.compact``) under an exclusive one.
"""
from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from comgra.store.filesystems import url_digest

JOURNAL_DIR = ".comgra-upload"
COMPACT_AT_LINES = 1024  # the journal is rewritten past this many lines and 4 per file that still matters
_HOST = os.uname().nodename if hasattr(os, "uname") else "host"


@dataclass(frozen=True)
class _Entry:
    op: str  # P (claimed), U (uploaded), D (deleted remotely)
    size: int
    mtime: int
    pid: int


class Journal:
    """The append-only record of one spool folder's uploads to one URL.

    A long run appends a claim, an upload and (for each part merged away) a delete per chunk: the file would grow
    without bound. ``compact`` rewrites it with the last line of each file that still matters, under an exclusive
    lock that every append takes shared, and a reader that meets the new file (another inode) reads it anew."""

    def __init__(self, local_root: Path, url: str):
        folder = local_root / JOURNAL_DIR
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{url_digest(url)}.log"
        self.entries: dict[str, _Entry] = {}
        self.lines = 0  # lines of the journal file read so far (its length, against len(entries))
        self._offset = 0
        self._inode: int | None = None
        self._lock = threading.Lock()
        self.read_new()

    def read_new(self) -> None:
        """The lines other processes appended since the last read."""
        with self._lock:
            self._read_new()

    def _read_new(self) -> None:
        try:
            with open(self.path, "rb") as stream:
                inode = os.fstat(stream.fileno()).st_ino
                if inode != self._inode:  # compacted by some process since the last read: read it from the start
                    self._inode, self._offset, self.lines = inode, 0, 0
                stream.seek(self._offset)
                data = stream.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.decode("utf-8", "replace").splitlines():
            self.lines += 1
            fields = line.split("\t")
            if len(fields) == 6 and fields[0] in "PUD" and fields[4] == _HOST:
                op, size, mtime, pid, _, key = fields
                self.entries[key] = _Entry(op, int(size), int(mtime), int(pid))
            elif len(fields) == 6 and fields[0] in "PUD":
                op, size, mtime, _, _, key = fields
                self.entries[key] = _Entry(op, int(size), int(mtime), -1)

    def append(self, op: str, key: str, size: int = 0, mtime: int = 0) -> None:
        self.append_many(op, [(key, size, mtime)])

    def append_many(self, op: str, items: list[tuple[str, int, int]]) -> None:
        """One line per (key, size, mtime), appended in one write (a pass claims its files in one)."""
        if items:
            self._append(op, lambda: items, fcntl.LOCK_SH)  # shared: not while ``compact`` rewrites it

    def claim(self, items: list[tuple[str, int, int]],
              taken: Callable[[str, int, int], bool]) -> list[tuple[str, int, int]]:
        """The items that ``taken`` does not say another process has, claimed (P) in one write: reading what others
        appended, choosing and appending happen under an exclusive lock, so that two uploaders starting together
        cannot both claim a file (each read the journal before the other's claims were in it)."""
        def choose() -> list[tuple[str, int, int]]:
            self._read_new()
            return [item for item in items if not taken(*item)]
        return self._append("P", choose, fcntl.LOCK_EX)

    def _append(self, op: str, choose: Callable[[], list[tuple[str, int, int]]],
                lock: int) -> list[tuple[str, int, int]]:
        """Lines ``op`` for the items ``choose()`` returns, chosen and written under ``lock`` on the journal file
        (the one ``compact`` has not replaced meanwhile) in one write: appends of processes never interleave."""
        pid = os.getpid()
        with self._lock:
            while True:
                descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(descriptor, lock)
                    try:
                        current = os.stat(self.path).st_ino
                    except FileNotFoundError:
                        current = None
                    if current == os.fstat(descriptor).st_ino:
                        chosen = choose()
                        if chosen:
                            os.write(descriptor, "".join(f"{op}\t{size}\t{mtime}\t{pid}\t{_HOST}\t{key}\n"
                                                         for key, size, mtime in chosen).encode())
                        break
                finally:
                    os.close(descriptor)  # the lock with it
            for key, size, mtime in chosen:
                self.entries[key] = _Entry(op, size, mtime, pid)
        return chosen

    def compact(self, keep: Callable[[str, _Entry], bool]) -> bool:
        """Rewrite the journal with the last line of each key that ``keep`` keeps (under an exclusive lock: the
        lines other processes append wait for it, and none is lost). Returns whether it was rewritten."""
        with self._lock:
            descriptor = os.open(self.path, os.O_RDONLY | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX)
                self._read_new()  # every line appended until now
                kept = {key: entry for key, entry in self.entries.items() if keep(key, entry)}
                temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
                with open(temporary, "w", encoding="utf-8") as out:
                    out.writelines(f"{e.op}\t{e.size}\t{e.mtime}\t{e.pid}\t{_HOST if e.pid >= 0 else '?'}\t{key}\n"
                                   for key, e in kept.items())
                os.replace(temporary, self.path)
                self.entries, self._inode, self._offset, self.lines = kept, None, 0, 0
                self._read_new()
                return True
            finally:
                os.close(descriptor)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

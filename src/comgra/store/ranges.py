"""Large Parquet objects of a mirror (``store.remote``), read through range reads: a sparse local copy.

A tensors chunk of a recording in a bucket can be tens of MiB, of which a page of the app reads one step or one
node: a few column chunks of a few row groups. Such an object (``lazy``: a tensors chunk of at least
``LAZY_BYTES``) is not downloaded by the mirror's refresh. Its local copy is a sparse file of the object's size
and time, holding its footer only (one or two ranged GETs of its tail). Before the reader reads a chunk (the page
checks, the series read, a scan), it asks ``fill`` for the byte ranges of the row groups and columns it is about
to read, computed from the footer; those missing are fetched with one ranged GET each (neighbours closer than
``MERGE_GAP`` in one) and written in place. DuckDB, pyarrow and the page checksums then read a local file as
before, at local speed, and a range is fetched once per mirror, not once per question.

Which ranges are filled is kept beside the mirror, in ``.ranges/<key>``: a first line with the object's size and
time, then one line ``start end`` per range written. A file without such a record is whole. A range is recorded
after its bytes are written, so a process that dies between the two only fetches it again.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path

import pyarrow.parquet as pq

from comgra.store.filesystems import Location

__all__ = ["LAZY_BYTES", "SparseCopies"]

LAZY_BYTES = 1 << 20  # a tensors chunk at least this large is read through range reads
FOOTER_GUESS = 64 << 10  # the tail read first: the footer and its length, for most chunks in one GET
MERGE_GAP = 256 << 10  # ranges closer than this are fetched in one GET (a round trip costs more than the bytes)
RECORDS = ".ranges"


def is_lazy(key: str, size: int, lazy_bytes: int | None) -> bool:
    """Whether the object ``key`` of ``size`` bytes is read through range reads (a large tensors chunk)."""
    parts = key.split("/")
    return lazy_bytes is not None and size >= lazy_bytes and parts[-1].endswith(".parquet") and "tensors" in parts[:-1]


def merged(ranges: Iterable[tuple[int, int]], gap: int = 0) -> list[tuple[int, int]]:
    """Sorted, disjoint ranges covering ``ranges`` (ends exclusive); ranges at most ``gap`` apart become one."""
    out: list[list[int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def missing(wanted: list[tuple[int, int]], filled: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``wanted`` (sorted, disjoint) that ``filled`` (sorted, disjoint) does not cover."""
    out = []
    for start, end in wanted:
        for low, high in filled:
            if high <= start or low >= end:
                continue
            if low > start:
                out.append((start, low))
            start = max(start, high)
            if start >= end:
                break
        if start < end:
            out.append((start, end))
    return out


class SparseCopies:
    """The sparse copies of one mirror (``local``, a copy of ``location``). Thread-safe; counts what it fetched."""

    def __init__(self, location: Location, local: Path):
        self.location = location
        self.local = local
        self.fetched_bytes = 0  # bytes of objects fetched through range reads (footers and row groups)
        self.range_reads = 0
        self._filled: dict[str, list[tuple[int, int]]] = {}
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}

    # -- the refresh's side --------------------------------------------------------------------------
    def recorded(self, key: str) -> tuple[int, int] | None:
        """(size, time) of the object a sparse copy of ``key`` stands for; None where the copy is whole."""
        try:
            head = (self.local / RECORDS / key).read_text().split("\n", 1)[0].split()
            return int(head[0]), int(head[1])
        except (OSError, ValueError, IndexError):
            return None

    def create(self, key: str, size: int, mtime: int) -> None:
        """A sparse copy of the object ``key``: its size and time, its footer, nothing else."""
        tail = min(size, FOOTER_GUESS)
        with self.location.filesystem.open_input_file(self.location.key(key)) as remote:
            data = self._read(remote, size - tail, tail)
            footer = int.from_bytes(data[-8:-4], "little") + 8
            if data[-4:] != b"PAR1" or footer > size:
                raise OSError(f"{self.location.url}/{key} is not a Parquet file (no footer)")
            if footer > tail:  # a footer larger than the guess: the rest of it in a second read
                data = self._read(remote, size - footer, footer - tail) + data
                tail = footer
        path = self.local / key
        record = self.local / RECORDS / key
        path.parent.mkdir(parents=True, exist_ok=True)
        record.parent.mkdir(parents=True, exist_ok=True)
        with self._lock_of(key):
            record.write_text(f"{size} {mtime}\n{size - tail} {size}\n")
            temporary = path.parent / f".tmp-{os.getpid()}-{threading.get_ident()}-{path.name}.partial"
            with open(temporary, "wb") as out:
                out.truncate(size)  # a hole: no disk used where nothing was fetched
                out.seek(size - tail)
                out.write(data)
            if mtime:
                os.utime(temporary, ns=(mtime, mtime))
            os.replace(temporary, path)
            with self._lock:
                self._filled[key] = [(size - tail, size)]

    def forget(self, key: str) -> None:
        """The record of a copy that is gone or was replaced by a whole one."""
        (self.local / RECORDS / key).unlink(missing_ok=True)
        with self._lock:
            self._filled.pop(key, None)

    # -- the reader's side ---------------------------------------------------------------------------
    def partial(self, path: Path) -> bool:
        key = self._key(path)
        return key is not None and self.recorded(key) is not None

    def fill(self, path: Path, row_groups: Iterable[int] | None = None, columns: Iterable[str] | None = None) -> int:
        """Fetch the byte ranges of ``row_groups`` x ``columns`` (None: all) of the chunk at ``path`` that its
        sparse copy lacks; nothing for a whole file. Returns the bytes fetched."""
        key = self._key(path)
        if key is None:
            return 0
        record = self.recorded(key)
        if record is None:
            return 0
        size, mtime = record
        with self._lock_of(key):
            filled = self._filled_of(key)
            if row_groups is None and columns is None:
                wanted = [(0, size)]
            else:
                wanted = merged(column_ranges(pq.read_metadata(path), row_groups, columns))
            gaps = merged(missing(wanted, filled), MERGE_GAP)
            if not gaps:
                return 0
            fetched = 0
            with self.location.filesystem.open_input_file(self.location.key(key)) as remote, \
                    open(path, "r+b") as out:
                for start, end in gaps:
                    data = self._read(remote, start, end - start)
                    out.seek(start)
                    out.write(data)
                    fetched += len(data)
            if mtime:  # the object's time again: the readers' caches and the next refresh key on it
                os.utime(path, ns=(mtime, mtime))
            filled = merged([*filled, *gaps])
            with open(self.local / RECORDS / key, "a") as record_file:
                record_file.write("".join(f"{a} {b}\n" for a, b in gaps))
            with self._lock:
                self._filled[key] = filled
            if filled == [(0, size)]:  # whole now: a plain file of the mirror
                self.forget(key)
            return fetched

    def _read(self, remote: object, offset: int, length: int) -> bytes:
        data = bytes(remote.read_at(length, offset))  # type: ignore[attr-defined]
        if len(data) != length:
            raise OSError(f"a range read of {self.location.url} returned {len(data)} of {length} bytes")
        with self._lock:
            self.fetched_bytes += length
            self.range_reads += 1
        return data

    def _filled_of(self, key: str) -> list[tuple[int, int]]:
        with self._lock:
            kept = self._filled.get(key)
        if kept is not None:
            return kept
        ranges = []
        try:  # another process (a scan beside the app) may have filled some
            for line in (self.local / RECORDS / key).read_text().splitlines()[1:]:
                start, end = line.split()
                ranges.append((int(start), int(end)))
        except (OSError, ValueError):
            pass
        return merged(ranges)

    def _key(self, path: Path) -> str | None:
        try:
            return Path(os.path.abspath(path)).relative_to(os.path.abspath(self.local)).as_posix()
        except ValueError:
            return None

    def _lock_of(self, key: str) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())


def column_ranges(metadata: pq.FileMetaData, row_groups: Iterable[int] | None,
                  columns: Iterable[str] | None) -> list[tuple[int, int]]:
    """The byte ranges of the column chunks of ``row_groups`` x ``columns`` (top-level names; None: all)."""
    names = None if columns is None else set(columns)
    groups = range(metadata.num_row_groups) if row_groups is None else row_groups
    out = []
    for group in groups:
        row_group = metadata.row_group(group)
        for index in range(row_group.num_columns):
            column = row_group.column(index)
            if names is not None and column.path_in_schema.split(".")[0] not in names:
                continue
            start = column.data_page_offset
            if column.has_dictionary_page and column.dictionary_page_offset is not None \
                    and 0 < column.dictionary_page_offset < start:
                start = column.dictionary_page_offset
            out.append((start, start + column.total_compressed_size))
    return out

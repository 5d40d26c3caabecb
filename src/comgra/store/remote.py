"""Reading a recording at a URL: a local mirror of its objects, refreshed at most once per poll.

A chunk never changes once written (a PUT is atomic, a merged chunk gets a new name), so ``GroupReader("s3://...")``
reads a mirror of the group's objects in ``<user cache dir>/comgra/mirror/<digest of the URL>`` with the same
code, DuckDB queries, page checksums and damage reports as a local recording. A refresh is one recursive
listing (S3: one LIST per 1,000 keys) and a GET of each object that is new or changed (the JSON documents a
live run rewrites); files that are gone remotely (parts merged away) go locally too. Like the uploader it keeps
the steps chunks last: they are fetched after every other new object of the same refresh, so a step the
mirror's index holds always has its data. ``Mirror.refresh`` does nothing when the last refresh is younger
than ``refresh_seconds``: the app's poll and the questions of one page share one listing.

Large tensors chunks (``ranges.is_lazy``: at least ``lazy_bytes``) are not downloaded whole: the refresh writes a
sparse copy holding the object's footer, and the reader fetches the byte ranges of the row groups and columns a
question reads before reading them (``Mirror.fill``, ``store.ranges``). Every other object (the steps index, the
small tables, the JSON documents, small chunks) is fetched whole once: one GET each, then local reads.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import platformdirs

from comgra.errors import StoreError
from comgra.store.filesystems import Location, is_url, local_path, open_location, url_digest
from comgra.store.ranges import LAZY_BYTES, SparseCopies, is_lazy
from comgra.store.uploader import is_commit, on_threads

__all__ = ["Mirror", "group_folder", "mirror_base", "poll"]

log = logging.getLogger("comgra.store")


def mirror_base() -> Path:
    return platformdirs.user_cache_path("comgra") / "mirror"


class Mirror:
    """The local copy of a remote folder (``location``) in ``local``."""

    def __init__(self, location: Location, local: Path | None = None, *, refresh_seconds: float = 2.0,
                 workers: int = 8, lazy_bytes: int | None = LAZY_BYTES):
        self.location = location
        self.local = local if local is not None else mirror_base() / url_digest(location.url)
        self.lazy_bytes = lazy_bytes  # None: every object fetched whole (``comgra repair URL`` rewrites them)
        self.sparse = SparseCopies(location, self.local)
        self.refresh_seconds = refresh_seconds
        self.workers = workers
        self.listings = 0  # remote listings so far (one per refresh)
        self.downloads = 0
        self.remote_files = 0  # objects the last listing found
        self.last_refresh_seconds = 0.0
        self._refreshed_at: float | None = None
        self._lock = threading.Lock()

    @classmethod
    def open(cls, url: str, *, storage_options: dict[str, Any] | None = None, **kwargs: Any) -> Mirror:
        """A Mirror of ``url``, refreshed once; a StoreError when nothing is there."""
        mirror = cls(open_location(url, storage_options), **kwargs)
        mirror.refresh(force=True)
        if not mirror.remote_files:
            raise StoreError(f"No recording at {url!r}: the store lists no objects there. Pass the group's URL, "
                             "i.e. <comgra_root_path URL>/<group>.")
        return mirror

    def refresh(self, *, force: bool = False) -> bool:
        """Bring the mirror up to date with one listing; False (and nothing done) when the last refresh is
        younger than ``refresh_seconds``."""
        # A refresh under way on another thread (the app's poll) answers for this one: the caller reads the mirror as
        # it is, rather than waiting for a second listing.
        if not self._lock.acquire(blocking=force or self._refreshed_at is None):
            return False
        try:
            return self._refresh(force)
        finally:
            self._lock.release()

    def _refresh(self, force: bool) -> bool:
        now = time.monotonic()
        # A listing that takes long (a group of thousands of trials) is not repeated back to back.
        interval = max(self.refresh_seconds, 2 * self.last_refresh_seconds)
        if not force and self._refreshed_at is not None and now - self._refreshed_at < interval:
            return False
        self._refreshed_at = now
        try:
            remote = self.location.list_files()
        except OSError:  # once more: a listing that met a dropped connection
            time.sleep(0.2)
            remote = self.location.list_files()
        self.listings += 1
        self.remote_files = len(remote)
        self.local.mkdir(parents=True, exist_ok=True)
        # Never a dot file or a file in a dot folder (GROUP/.replaced/: earlier runs of a trial, kept in the bucket).
        wanted = [key for key, (size, mtime) in remote.items()
                  if not any(part.startswith(".") for part in key.split("/")) and self._differs(key, size, mtime)]
        self._fetch([key for key in wanted if not is_commit(key)], remote)
        self._fetch([key for key in wanted if is_commit(key)], remote)  # the index after its data
        # Not what a scan wrote into the mirror since this listing began: it is being published (``publish``).
        listed_at = time.time_ns() - int((time.monotonic() - now) * 1e9)
        self._forget([key for key in self._local_keys() if key not in remote], younger_than=listed_at)
        self.last_refresh_seconds = time.monotonic() - now
        return True

    def _differs(self, key: str, size: int, mtime: int) -> bool:
        try:
            status = (self.local / key).stat()
        except FileNotFoundError:
            return True
        same = status.st_size == size and (mtime == 0 or status.st_mtime_ns == mtime)
        if same and self.lazy_bytes is not None:
            return False  # the usual case: one stat, no record read
        # A sparse copy: its record holds the object's size and time (its file's time moves while ranges are written);
        # without lazy reads (``comgra repair URL``) it is fetched whole.
        recorded = self.sparse.recorded(key)
        if recorded is not None:
            return recorded != (size, mtime) or not is_lazy(key, size, self.lazy_bytes)
        return not same

    def _fetch(self, keys: list[str], remote: dict[str, tuple[int, int]]) -> None:
        errors: list[BaseException] = []
        pending = list(keys)
        lock = threading.Lock()

        def work() -> None:
            while True:
                with lock:
                    if not pending or errors:
                        return
                    key = pending.pop()
                try:
                    size, mtime = remote[key]
                    if is_lazy(key, size, self.lazy_bytes):
                        self.sparse.create(key, size, mtime)
                    else:
                        self._fetch_one(key, mtime)
                except FileNotFoundError:
                    pass  # deleted (merged away) since the listing: the next refresh forgets it
                except Exception as error:  # noqa: BLE001 - re-raised below, on the caller's thread
                    with lock:
                        errors.append(error)

        on_threads(work, min(self.workers, len(keys)), "comgra-mirror")
        if errors:
            self._refreshed_at = None  # try again at the next question
            raise StoreError(f"comgra could not read {self.location.url!r}: {errors[0]}") from errors[0]

    def _fetch_one(self, key: str, mtime: int) -> None:
        for attempt in range(3):  # a dropped connection or a 503 the filesystem's own retries did not absorb
            try:
                data = self.location.download(key)
                break
            except FileNotFoundError:
                raise
            except OSError:
                if attempt == 2:
                    raise
                time.sleep(0.2 * 4 ** attempt)
        path = self.local / key
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.parent / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}-{path.name}.partial"
        temporary.write_bytes(data)
        if mtime:
            os.utime(temporary, ns=(mtime, mtime))
        os.replace(temporary, path)  # readers of the mirror never see a partial file
        self.sparse.forget(key)
        self.downloads += 1

    def _local_keys(self) -> list[str]:
        keys = []
        for directory, folders, files in os.walk(self.local):
            folders[:] = [f for f in folders if not f.startswith(".")]
            relative = Path(directory).relative_to(self.local).as_posix()
            keys += [name if relative == "." else f"{relative}/{name}" for name in files if not name.startswith(".")]
        return keys

    def _forget(self, keys: list[str], younger_than: int | None = None) -> None:
        for key in keys:
            path = self.local / key
            try:
                if younger_than is not None and path.stat().st_mtime_ns >= younger_than:
                    continue
            except FileNotFoundError:
                continue
            path.unlink(missing_ok=True)
            self.sparse.forget(key)

    def fill(self, path: Path, row_groups: Any = None, columns: Any = None) -> None:
        """Bring the byte ranges of ``row_groups`` x ``columns`` (None: all) of a chunk into its sparse copy before it
        is read (nothing for a whole file); a store that fails is a StoreError naming the URL."""
        for attempt in range(3):  # a dropped connection or a 503 the filesystem's own retries did not absorb
            try:
                self.sparse.fill(path, row_groups, columns)
                return
            except FileNotFoundError:
                raise
            except OSError as error:
                if attempt == 2:
                    raise StoreError(f"comgra could not read {self.location.url!r}: {error}") from error
                time.sleep(0.2 * 4 ** attempt)

    def publish(self, paths: list[Path]) -> int:
        """Upload files written into the mirror (the findings a scan saved) to the store, so that a scan or the
        app on another machine reads them; each local copy then takes the object's time, so that the next
        refresh does not download it again. Returns the files uploaded; a store that refuses is logged."""
        sent = 0
        for path in paths:
            try:
                key = path.resolve().relative_to(self.local.resolve()).as_posix()
            except ValueError:
                continue  # not in this mirror
            try:
                if not path.is_file():
                    continue
                self.location.upload(path, key)
                info = self.location.filesystem.get_file_info(self.location.key(key))
                if info.mtime_ns:
                    os.utime(path, ns=(info.mtime_ns, info.mtime_ns))
                sent += 1
            except OSError as error:  # a read-only bucket, the store away: the findings stay in this mirror
                log.warning("comgra could not upload %s to %s: %s", key, self.location.url, error)
        return sent


def group_folder(path: Any, storage_options: dict[str, Any] | None = None) -> tuple[Path, Mirror | None]:
    """The local folder a GroupReader reads for ``path`` (a folder, a file:// URL, or a URL it mirrors)."""
    if is_url(path):
        mirror = Mirror.open(path, storage_options=storage_options)
        return mirror.local, mirror
    return local_path(path).resolve(), None


def poll(mirror: Mirror | None) -> None:
    """Refresh a reader's mirror (at most once per ``refresh_seconds``); a store that does not answer now leaves
    the mirror as it was, with a log line (the app keeps showing what it has)."""
    if mirror is None:
        return
    try:
        mirror.refresh()
    except StoreError as error:
        log.warning("%s; showing the copy of %s", error, mirror.local)


def repair_remote(url: str, storage_options: dict[str, Any] | None = None) -> list[Any]:
    """``comgra repair URL``: the repair of a local recording, done on a fresh mirror, and every file it removed
    (chunks already merged into another, left by an uploader that died first) deleted in the store as well."""
    from comgra.store.repair import repair_group

    mirror = Mirror.open(url, storage_options=storage_options, lazy_bytes=None)
    before = set(mirror._local_keys())
    repairs = repair_group(mirror.local)
    for key in sorted(before - set(mirror._local_keys())):
        mirror.location.delete(key)
    return repairs

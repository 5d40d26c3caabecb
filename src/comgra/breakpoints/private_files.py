"""The files of ``<trial>/live/``: private to their owner, never read or written through a link.

``live/`` holds the token of a paused run (``run.json``), so it is created 0700 and every file in it
0600 from the moment it exists (an existing ``live/`` open to others is closed on the next write).
A ``live/`` that is a link, or a file in it that is a link, a FIFO or larger than
``MAX_DOCUMENT_BYTES``, is refused with a StoreError: a recording from elsewhere cannot make comgra
read or write outside it, nor block on a read.

    >>> write(trial_dir / "live", "run.json", {"state": "running"})          # doctest: +SKIP
    >>> read(trial_dir / "live", "run.json")                                 # doctest: +SKIP
    b'{\\n "state": "running"\\n}'
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from comgra.errors import StoreError

__all__ = ["MAX_DOCUMENT_BYTES", "folder", "read", "write", "locked"]

MAX_DOCUMENT_BYTES = 1024 * 1024  # breakpoints.json, run.json
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def folder(directory: Path, *, create: bool) -> Path:
    """``<trial>/live``, refused when it is a link (or not a folder); created 0700, or closed to others."""
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        if not create:
            return directory
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile: checked below like any
            os.mkdir(directory, 0o700)  # the trial folder must exist: one that is gone is never recreated
        info = os.lstat(directory)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise StoreError(f"{str(directory)!r} is a link or not a folder; comgra reads and writes nothing through "
                         "it. Remove it: comgra creates the folder when it needs one.")
    if create and stat.S_IMODE(info.st_mode) & 0o077 and info.st_uid == getattr(os, "getuid", lambda: -1)():
        os.chmod(directory, 0o700)  # an older comgra's live/ (0755): it holds the token of a paused run
    return directory


def read(directory: Path, name: str) -> bytes:
    """A regular file of live/, never through a link, never blocking on a FIFO, at most MAX_DOCUMENT_BYTES."""
    path = folder(directory, create=False) / name
    try:
        descriptor = os.open(path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise StoreError(f"{str(path)!r} is a link; comgra reads nothing through it. Delete it.") from None
        raise
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise StoreError(f"{str(path)!r} is not a regular file; delete it.")
        if info.st_size > MAX_DOCUMENT_BYTES:
            raise StoreError(f"{str(path)!r} has {info.st_size} bytes, more than {MAX_DOCUMENT_BYTES}; delete it.")
        return handle.read(MAX_DOCUMENT_BYTES + 1)


def write(directory: Path, name: str, document: dict[str, Any]) -> None:
    """Write atomically (readers never see half a file), 0600 from the moment the file exists."""
    directory = folder(directory, create=True)
    temporary = directory / f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(json.dumps(document, indent=1).encode())
        os.replace(temporary, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on ``directory/.lock`` (fcntl; on Windows none: edits are rare and human-paced,
    and the atomic write still protects readers)."""
    directory = folder(directory, create=True)
    try:
        import fcntl
    except ImportError:
        yield
        return
    descriptor = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

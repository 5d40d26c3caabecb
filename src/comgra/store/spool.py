"""A recorder's root at a URL: the node-local spool it writes into, and the uploader that mirrors the spool.

``ComgraRecorder("s3://bucket/runs", group, trial)`` records into ``<spool>/<digest of the URL>/<group>/...`` with
the durable local writer (fsync, renames, locks: all local) and uploads that group folder to
``s3://bucket/runs/<group>/...`` on a background thread (``store.uploader``). The spool is
``[storage] spool_dir`` of comgra.toml or ``<user cache dir>/comgra/spool``; the same URL always gets the same
spool folder, so the next run of a trial after a crash finds what was not uploaded yet and sends it.

Once a finished rank's files are all in the bucket (each journaled as uploaded, at its size and time), finalize
removes them from the spool (``remove_uploaded``; ``[storage] keep_uploaded = true`` keeps them): the rank's
folders of every table, and the trial's folder of JSON documents once no rank of the trial is left. A folder is
first renamed to a hidden name, then deleted, so that no uploader of the spool ever sees part of it gone (a file
gone from a folder that is still there reads as merged away, and is deleted remotely). The journal keeps their
lines: a later run of the same trial in this spool replaces them in the bucket, as it replaces a trial that is
still in the spool.

A new run of a trial moves the earlier run's files in the spool aside to ``GROUP/.replaced/<trial>-<time>-<pid>/``, as
on local disk, and its uploader deletes the earlier objects in the bucket as it finds them gone. So that the node's
disk is not filled by earlier runs nobody looks at there, finalize uploads such a folder to the
same place in the bucket, ``GROUP/.replaced/<name>/`` (where a user of local disk would look; comgra's readers and
the engines' table roots never read it), and removes it from the spool once every file of it is journaled as
uploaded (``upload_replaced``). A folder that another living process may still be moving into is left alone.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from comgra.errors import StoreError
from comgra.store import format as fmt
from comgra.store import layout
from comgra.store.filesystems import is_url, local_path, open_location, url_digest
from comgra.store.upload_journal import Journal, _alive
from comgra.store.uploader import Uploader, local_files

__all__ = ["RecordingRoot", "SpoolFull", "recording_root", "spool_base", "start_upload", "finish_upload",
           "remove_uploaded", "upload_replaced"]

log = logging.getLogger("comgra.store")
REPLACED = ".replaced"
# <trial>-<YYYYmmdd-HHMMSS>-<pid> (one process), <trial>-<YYYYmmdd-HHMMSS>-r<rank>-<pid> (a rank of a distributed run)
_REPLACED_NAME = re.compile(r"^(?P<trial>.+)-\d{8}-\d{6}-(?:r\d+-)?(?P<pid>\d+)$")


class SpoolFull(StoreError):
    """More than ``[storage] spool_limit_gb`` waits for upload: recording stops, the training goes on."""


@dataclass(frozen=True)
class RecordingRoot:
    """Where a recorder writes (``local``) and, for a URL root, where that is uploaded to (``url``)."""

    local: Path
    url: str | None = None


def spool_base(settings: Any = None) -> Path:
    folder = getattr(getattr(settings, "storage", None), "spool_dir", "") or ""
    return Path(folder).expanduser() if folder else platformdirs.user_cache_path("comgra") / "spool"


def recording_root(root: Any, settings: Any = None) -> RecordingRoot:
    """The local folder of a recorder's root; for a URL its spool folder, after checking that the URL can be
    opened (scheme known, packages installed): a ConfigError here, at the recorder's creation, never later."""
    if is_url(root):
        open_location(root, config=settings)
        url = root.rstrip("/")
        return RecordingRoot((spool_base(settings) / url_digest(url)).resolve(), url)
    return RecordingRoot(local_path(root).resolve())


def start_upload(local_group: Path, url_group: str, settings: Any = None, trial_id: str | None = None) -> Uploader:
    """The running uploader of one group folder of the spool (its journal in the spool root). With ``trial_id``,
    its passes after the first walk only that trial's folders (the first sends what earlier runs left). A fresh chunk
    goes up once it is ``[storage] upload_delay_s`` old while the training runs (see ``Uploader``)."""
    storage = getattr(settings, "storage", None)
    limit = int(float(getattr(storage, "spool_limit_gb", 20.0)) * 2 ** 30)

    def trial_folders() -> list[str]:
        assert trial_id is not None
        return [f"{fmt.TRIALS_DIR}/{trial_id}"] + [folder.relative_to(local_group).as_posix()
                                                    for folder in layout.trial_partitions(local_group, trial_id)]

    return Uploader(local_group, open_location(url_group, config=settings), journal_root=local_group.parent,
                    limit_bytes=limit, scope=None if trial_id is None else trial_folders,
                    delay=float(getattr(storage, "upload_delay_s", 10.0))).start()


def finish_upload(uploader: Uploader, settings: Any = None) -> str | None:
    """Wait (at most ``[storage] upload_timeout_s``) until the spool is uploaded; a message when it is not."""
    timeout = float(getattr(getattr(settings, "storage", None), "upload_timeout_s", 300.0))
    result = uploader.finish(timeout)
    if not result.pending and not result.errors:
        return None
    reason = f" (last error: {result.errors[-1]})" if result.errors else ""
    return (f"comgra could not upload {result.pending} file(s) ({result.pending_bytes / 2**20:.1f} MiB) of "
            f"{str(uploader.local)!r} to {uploader.remote.url!r} within {timeout:g} s{reason}. They are kept there; "
            f"the next run of this trial uploads them, or run: comgra sync {str(uploader.local)!r} "
            f"{uploader.remote.url!r}")


def spool_full_message(uploader: Uploader, settings: Any = None) -> str:
    return (f"the spool {str(uploader.local)!r} holds more than its limit of files not yet uploaded to "
            f"{uploader.remote.url!r} ([storage] spool_limit_gb in comgra.toml); comgra stopped recording so that "
            f"the node's disk does not fill. What it recorded is kept there and uploaded when the store answers "
            f"(last error: {uploader.last.errors[-1] if uploader.last.errors else 'none'}).")


def remove_uploaded(uploader: Uploader, trial_id: str, rank: int, timeout: float = 60.0) -> int:
    """Remove one finished rank of a trial from the spool once the bucket holds every file of it (journaled as
    uploaded at its present size and time); the trial's folder too when no rank of it is left; then the earlier
    runs of the trial that the spool moved aside (``upload_replaced``, at most ``timeout`` seconds). Returns the
    bytes freed; 0 (and nothing removed) while any file waits for upload."""
    group = uploader.local
    trial_dir = fmt.trial_dir(group, trial_id)
    folders = [layout.partition_dir(group, partition.parent.name, trial_id, rank)
               for partition in layout.trial_partitions(group, trial_id)]
    folders = [folder for folder in folders if folder.is_dir()]
    last_rank = not any(child.is_dir() and child not in folders for partition in layout.trial_partitions(group, trial_id)
                        for child in partition.iterdir())
    if last_rank and trial_dir.is_dir():
        folders.append(trial_dir)
    files = local_files(group, [folder.relative_to(group).as_posix() for folder in folders])
    if not _all_uploaded(uploader.journal, files):
        return 0
    for folder in folders:
        _remove(folder, group)
    if last_rank:
        for partition in layout.trial_partitions(group, trial_id):
            try:
                partition.rmdir()  # empty now
            except OSError:
                pass
    freed = sum(size for size, _ in files.values())
    try:
        freed += upload_replaced(uploader, trial_id, timeout)
    except Exception as error:  # noqa: BLE001 - housekeeping: a fault here never reaches the training
        log.warning("comgra could not send the earlier runs in %s to the bucket: %s", uploader.local / REPLACED, error)
    return freed


def upload_replaced(uploader: Uploader, trial_id: str | None = None, timeout: float = 300.0) -> int:
    """Upload the spool's earlier runs (``GROUP/.replaced/<name>/``, of ``trial_id`` or of every trial) to
    ``<url>/.replaced/<name>/`` and remove each folder once the journal holds every file of it as uploaded, at its
    present size and time. Only folders whose mover (the pid in the name) is this process or dead: another living
    process may still be moving files into its folder. Returns the bytes freed; a folder whose upload did not finish
    (within ``timeout`` seconds in all) stays, and the next finalize of the trial in this spool tries again."""
    base = uploader.local / REPLACED
    deadline = time.monotonic() + timeout
    freed = 0
    try:
        folders = sorted(entry for entry in base.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    except FileNotFoundError:
        return 0
    for folder in folders:
        match = _REPLACED_NAME.match(folder.name)
        if match is None or (trial_id is not None and match.group("trial") != trial_id) \
                or not (int(match.group("pid")) == os.getpid() or not _alive(int(match.group("pid")))):
            continue
        remote = uploader.remote.child(f"{REPLACED}/{folder.name}")
        sending = Uploader(folder, remote, journal_root=uploader.local.parent, workers=uploader.workers)
        result = sending.finish(max(0.0, deadline - time.monotonic()))
        files = local_files(folder)
        if result.pending or result.errors or not _all_uploaded(sending.journal, files) or not _remove(folder, base):
            continue
        sending.journal.path.unlink(missing_ok=True)  # its lines name files that are gone from the spool for good
        freed += sum(size for size, _ in files.values())
    return freed


def _all_uploaded(journal: Journal, files: dict[str, tuple[int, int]]) -> bool:
    """Whether the journal (read anew) holds each of ``files`` as uploaded at its present size and time."""
    journal.read_new()
    for key, version in files.items():
        entry = journal.entries.get(key)
        if entry is None or entry.op != "U" or (entry.size, entry.mtime) != version:
            return False
    return True


def _remove(folder: Path, parent: Path) -> bool:
    """Remove ``folder``: renamed to a hidden name in ``parent`` first, all of it at once (see the module's
    docstring), then deleted. False if it could not be renamed (it stays)."""
    hidden = parent / f".uploaded-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        os.rename(folder, hidden)
    except OSError:
        return False
    shutil.rmtree(hidden, ignore_errors=True)
    return True

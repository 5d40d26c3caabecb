"""The Runs rows of a group kept in one small Parquet table, so that a fresh app reads one file, not every trial.

Computing the Runs rows of 1,000 finished trials reads each trial's metadata, hyperparameters, chunk
listings and KPI chunks: about 1 CPU-s, and 2-4 s of wall on a loaded machine, on the click of a fresh app.
Once computed, the rows are written here, with each trial's key; the next app (or the same one after a
restart) reads this one file and computes only the trials whose key changed since:

    GROUP/.runs-summary.parquet    one row per trial: trial, folder (inode, mtime_ns), status, steps,
                                   created, ended, hyperparameters and kpis (JSON text), the findings
                                   file's (name, mtime_ns, size) and its counts by severity

**When a kept row is used.** Only for a trial that no writer holds now, whose folder has the same inode and
modification time as when the row was computed (the key of ``service.changes``: every writer session, of
any rank, writes its metadata JSON into the trial folder when it opens, a new run under the same id gets a
new folder, and recording hyperparameters replaces their document there). Rows of live trials and rows
with problems (damaged chunks) are never kept. Findings counts are used only while the saved findings file
has the same name, modification time and size. Anything else in the file is ignored; a file that cannot be
read (damaged, of another version, absent: groups from before it existed) means every row is computed, as
before. A group folder that cannot be written (read-only, a full disk) keeps no file; nothing is raised.

The file is a cache of what comgra computes from the trials; the trials stay the truth. It starts with a
dot, so the object-storage mirror and uploads pass it by.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from comgra.store import format as fmt

log = logging.getLogger(__name__)

FILE = ".runs-summary.parquet"
VERSION = "1"  # in the file's metadata: a file of another version is not read
SEVERITIES = ("error", "warning", "info")
SCHEMA = pa.schema([
    ("trial", pa.string()), ("folder_inode", pa.int64()), ("folder_mtime_ns", pa.int64()),
    ("status", pa.string()), ("steps", pa.int64()), ("created", pa.float64()), ("ended", pa.float64()),
    ("hyperparameters", pa.string()), ("kpis", pa.string()),
    ("findings_file", pa.string()), ("findings_mtime_ns", pa.int64()), ("findings_size", pa.int64()),
    *((severity, pa.int64()) for severity in SEVERITIES)],
    metadata={"comgra_runs_summary": VERSION})


@dataclass(frozen=True)
class KeptRow:
    """A trial's row as computed when its folder was ``folder``; its findings counts as of ``findings``."""

    trial: str
    folder: tuple[int, int]
    status: str
    steps: int
    created: float | None
    ended: float | None
    hyperparameters: dict[str, Any]
    kpis: dict[str, dict[str, float | None]]
    findings: tuple[str, int, int] | None  # (file name, mtime_ns, size) of the saved findings; None: none saved
    counts: dict[str, int] | None  # by severity, as of ``findings``; None: not known


def path_of(group_dir: Path) -> Path:
    return Path(group_dir) / FILE


def read(group_dir: Path) -> dict[str, KeptRow]:
    """The kept rows by trial; empty where there is no file or it cannot be read (every row is computed then)."""
    path = path_of(group_dir)
    try:
        table = pq.read_table(path, page_checksum_verification=True)
        if (table.schema.metadata or {}).get(b"comgra_runs_summary") != VERSION.encode() or \
                not table.schema.remove_metadata().equals(SCHEMA.remove_metadata()):
            return {}
        columns = {name: table[name].to_pylist() for name in SCHEMA.names}
        kept = {}
        for index, trial in enumerate(columns["trial"]):
            value = {name: columns[name][index] for name in SCHEMA.names}
            name = value["findings_file"]
            findings = None if name is None else (name, value["findings_mtime_ns"], value["findings_size"])
            counts = None if value["error"] is None else {s: int(value[s]) for s in SEVERITIES}
            kept[trial] = KeptRow(trial, (value["folder_inode"], value["folder_mtime_ns"]), value["status"],
                                  value["steps"], value["created"], value["ended"],
                                  json.loads(value["hyperparameters"]), json.loads(value["kpis"]), findings, counts)
        return kept
    except FileNotFoundError:
        return {}
    except (OSError, pa.ArrowException, ValueError, TypeError, KeyError) as error:  # damaged: compute every row
        log.debug("comgra: the runs summary %s cannot be read (%s); the rows are computed", path, error)
        return {}


def write(group_dir: Path, rows: Iterable[KeptRow]) -> bool:
    """Replace the file with ``rows`` (atomically); False where the group cannot be written (nothing raised)."""
    rows = sorted(rows, key=lambda r: r.trial)
    columns: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    for row in rows:
        found = row.findings or (None, None, None)
        counts = row.counts or dict.fromkeys(SEVERITIES)
        for name, value in (("trial", row.trial), ("folder_inode", row.folder[0]), ("folder_mtime_ns", row.folder[1]),
                            ("status", row.status), ("steps", row.steps), ("created", row.created),
                            ("ended", row.ended), ("hyperparameters", _json(row.hyperparameters)),
                            ("kpis", _json(row.kpis)), ("findings_file", found[0]), ("findings_mtime_ns", found[1]),
                            ("findings_size", found[2]), *((s, counts[s]) for s in SEVERITIES)):
            columns[name].append(value)
    try:
        fmt.write_parquet_atomic(path_of(group_dir), pa.table(columns, schema=SCHEMA))
        return True
    except (OSError, pa.ArrowException) as error:
        log.debug("comgra: the runs summary of %s is not kept (%s)", group_dir, error)
        return False


def findings_key(path: Path) -> tuple[str, int, int] | None:
    """(name, mtime_ns, size) of a saved findings file, None where there is none."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return path.name, status.st_mtime_ns, status.st_size


def _json(value: Mapping[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


__all__ = ["FILE", "SCHEMA", "KeptRow", "findings_key", "path_of", "read", "write"]

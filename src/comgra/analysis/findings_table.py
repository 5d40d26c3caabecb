"""The findings of a scan as a table in the group's layout, so that an engine answers questions over a sweep.

Besides the signed JSON the app reads (``comgra.analysis.saved``), each scanned trial's findings are written as
one Parquet file of the ``findings`` table, partitioned like every other table of the group::

    GROUP/findings/trial=<escaped id>/rank=0/findings.parquet

One schema (``SCHEMA``), no trial or rank column in the file (they come from the folder names, which DuckDB,
pyarrow and Spark read as Hive partitions). A trial with no findings gets a file with no rows, so that "which
trials were scanned" is a query too. The file is written under a temporary name and renamed, and a rescan
replaces it: a retried task (Ray, Dask) or a second scan never doubles a trial's rows. It holds the findings of
the trial's latest scan, at the ``sensitivity`` and options it names; a scan that finds the trial's JSON current
rewrites the file only if the file is of other options or other data.

Which of 1,000 trials have dying units, by learning rate, in one query::

    SELECT trial, count(*) AS nodes FROM read_parquet('GROUP/findings/*/*/*.parquet', hive_partitioning = true)
    WHERE detector = 'dead_units' GROUP BY trial ORDER BY trial
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from comgra.analysis.findings import Finding, ScanOptions
from comgra.store import layout

log = logging.getLogger("comgra.analysis")
TABLE = "findings"
FILE = "findings.parquet"
RANK = 0  # findings are of a trial, all its ranks together
_VERSION_KEY = b"comgra.findings.version"  # Parquet key-value metadata: which options and data the rows are of


def schema() -> Any:
    """The columns of the findings table (pyarrow, imported on first use)."""
    import pyarrow as pa

    return pa.schema([
        pa.field("detector", pa.string(), nullable=False),
        pa.field("severity", pa.string(), nullable=False),  # error, warning, info
        pa.field("score", pa.float64()),
        pa.field("node", pa.string()),
        pa.field("role", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("training_step", pa.int64()),  # the first step where it shows
        pa.field("iteration", pa.int64()),
        pa.field("message", pa.string()),
        pa.field("steps", pa.list_(pa.int64())),
        pa.field("evidence", pa.string()),  # JSON
        pa.field("aggregation", pa.string()),
        pa.field("statistic", pa.string()),
        pa.field("origin", pa.bool_()),
        pa.field("sensitivity", pa.float64()),
        pa.field("options", pa.string()),  # JSON of the ScanOptions
    ])


def path_of(group_dir: Path, trial_id: str) -> Path:
    return layout.partition_dir(group_dir, TABLE, trial_id, RANK) / FILE


def version(options: ScanOptions, signature: tuple[str, ...]) -> str:
    """What a findings file is of: the options and the trial's chunks."""
    text = json.dumps({"options": asdict(options), "signature": list(signature)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def is_current(group_dir: Path, trial_id: str, options: ScanOptions, signature: tuple[str, ...]) -> bool:
    """Whether the trial's findings file holds the findings at these options and data (its footer only)."""
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_schema(path_of(group_dir, trial_id)).metadata or {}
    except (OSError, ValueError):
        return False
    return metadata.get(_VERSION_KEY) == version(options, signature).encode()


def table_of(found: list[Finding], options: ScanOptions) -> Any:
    import pyarrow as pa

    from comgra.analysis.saved import plain

    option_text = json.dumps(asdict(options), sort_keys=True)
    rows = [{"detector": f.detector, "severity": f.severity, "score": _number(f.score), "node": f.node,
             "role": f.role, "kind": f.kind, "training_step": f.training_step, "iteration": f.iteration,
             "message": f.message, "steps": [int(s) for s in f.steps],
             "evidence": json.dumps(plain(f.evidence), sort_keys=True), "aggregation": f.aggregation,
             "statistic": f.statistic, "origin": bool(f.origin), "sensitivity": float(options.sensitivity),
             "options": option_text} for f in found]
    return pa.Table.from_pylist(rows, schema=schema())


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def write(group_dir: Path, trial_id: str, found: list[Finding], options: ScanOptions,
          signature: tuple[str, ...]) -> bool:
    """Replace the trial's findings file, atomically; False (nothing written) where the group is read-only."""
    import pyarrow.parquet as pq

    table = table_of(found, options).replace_schema_metadata({_VERSION_KEY: version(options, signature).encode()})
    path = path_of(group_dir, trial_id)
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, name = tempfile.mkstemp(prefix=".findings-", suffix=".tmp", dir=path.parent)
        os.close(descriptor)
        temporary = Path(name)
        pq.write_table(table, temporary)
        os.replace(temporary, path)
    except OSError as error:
        log.debug("comgra: findings table of %r not written: %s", trial_id, error)
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        return False
    return True

"""Where each table of a group lives in format 3: one Hive-partitioned Parquet dataset per table.

    GROUP/<table>/trial=<escaped id>/rank=<r>/<chunk>.parquet     Parquet only, one schema per table
    GROUP/trials/<trial id>/                                      JSON documents (trial.json, graphs/, live/, ...)

Any engine reads a table without path tricks, e.g. DuckDB's
``read_parquet('GROUP/tensors/**/*.parquet', hive_partitioning=true)``, ``pyarrow.dataset.dataset('GROUP/tensors',
partitioning='hive')`` or Spark's ``spark.read.parquet('GROUP/tensors')``: ``trial`` and ``rank`` come from the
folder names, so the files themselves hold neither column (Spark refuses a column that is both).

A trial id may hold characters that a folder name or a Hive partition value cannot: they are percent-encoded
(``%2F`` for ``/``, ``%3D`` for ``=``, ``%25`` for ``%``), the rule Hive and Spark use and that pyarrow
(``segment_encoding="uri"``), DuckDB and Spark undo when they read the partition value. Only ASCII is encoded:
non-ASCII characters stay as they are (Spark decodes each ``%XX`` as one character, not as UTF-8 bytes).
"""
from __future__ import annotations

from pathlib import Path

TRIAL_PARTITION = "trial"
RANK_PARTITION = "rank"
# ASCII characters a partition value keeps as they are; every other ASCII character is written as %XX.
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-+@~,")


def escape_partition_value(value: str) -> str:
    """``value`` as one path segment of a Hive partition folder (``a/b=c`` -> ``a%2Fb%3Dc``)."""
    return "".join(c if c in _SAFE or ord(c) > 127 else "".join(f"%{b:02X}" for b in c.encode()) for c in value)


def unescape_partition_value(segment: str) -> str:
    """The inverse of ``escape_partition_value``; a ``%`` not followed by two hex digits is kept as it is."""
    out: list[str] = []
    i = 0
    while i < len(segment):
        code = segment[i + 1:i + 3]
        if segment[i] == "%" and len(code) == 2 and all(c in "0123456789abcdefABCDEF" for c in code):
            out.append(chr(int(code, 16)))
            i += 3
        else:
            out.append(segment[i])
            i += 1
    return "".join(out)


def table_root(group_dir: Path, table: str) -> Path:
    """The dataset of one table over every trial and rank of the group: what an engine is pointed at."""
    return group_dir / table


def trial_partition(group_dir: Path, table: str, trial_id: str) -> Path:
    """The folder of one trial within a table's dataset (all its ranks below it)."""
    return table_root(group_dir, table) / f"{TRIAL_PARTITION}={escape_partition_value(trial_id)}"


def partition_dir(group_dir: Path, table: str, trial_id: str, rank: int) -> Path:
    """The folder that holds the chunks one rank of one trial wrote into one table."""
    return trial_partition(group_dir, table, trial_id) / f"{RANK_PARTITION}={int(rank)}"


def parse_partition_segment(segment: str, key: str) -> str | None:
    """The value of a ``key=value`` folder name, unescaped; None for a folder of another key."""
    prefix = f"{key}="
    return unescape_partition_value(segment[len(prefix):]) if segment.startswith(prefix) else None

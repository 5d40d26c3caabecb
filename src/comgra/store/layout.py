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

import os
from pathlib import Path

import pyarrow as pa

from comgra.store import format as fmt

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


# -- the tables of one trial, in the layout of its format ------------------------------------------------------
def group_of(trial_directory: Path) -> Path:
    """The group folder of a trial folder (``GROUP/trials/<id>``). A trial folder that is not in a group's
    ``trials/`` (a tool's or a test's loose trial) is its own group: its tables go inside it, never beside it."""
    return trial_directory.parent.parent if trial_directory.parent.name == fmt.TRIALS_DIR else trial_directory


def rank_dir(trial_directory: Path, table: str, rank: int) -> Path:
    """Where one rank of a trial writes one table (format 3), from the trial's folder of JSON documents."""
    return partition_dir(group_of(trial_directory), table, trial_directory.name, rank)


def rank_of_folder(folder: Path) -> int | None:
    """The rank of a ``rank=<r>`` folder, None for a folder of another name."""
    value = parse_partition_segment(folder.name, RANK_PARTITION)
    return int(value) if value is not None and value.isdigit() else None


def table_dirs(trial_directory: Path, table: str, format_version: int) -> list[Path]:
    """The folders that hold a trial's chunks of ``table``: one per rank in format 3 (sorted by rank; links to
    folders are never followed), the trial's own ``<table>/`` folder in formats 1 and 2."""
    if format_version < 3:
        return [trial_directory / table]
    trial_root = trial_partition(group_of(trial_directory), table, trial_directory.name)
    if trial_root.is_symlink():
        return []
    try:
        entries = [e for e in os.scandir(trial_root) if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    ranked = [(rank, trial_root / e.name) for e in entries if (rank := rank_of_folder(Path(e.name))) is not None]
    return [path for _, path in sorted(ranked)]


def rank_of_chunk(path: Path) -> int:
    """The rank whose rows a chunk holds: its ``rank=<r>`` folder (format 3), else its name (formats 1, 2)."""
    rank = rank_of_folder(path.parent)
    if rank is None:
        rank = fmt.rank_of(path.name)
    return rank if rank is not None else 0


def table_of_chunk(path: Path) -> str:
    """The table a chunk belongs to: the folder above ``trial=<id>/rank=<r>/`` (format 3), else its own folder."""
    if rank_of_folder(path.parent) is not None and path.parent.parent.name.startswith(f"{TRIAL_PARTITION}="):
        return path.parent.parent.parent.name
    return path.parent.name


def chunk_label(path: Path) -> str:
    """How messages name a chunk: ``<table>/<chunk name>`` (the chunk's name holds its rank)."""
    return f"{table_of_chunk(path)}/{path.name}"


def trial_partitions(group_dir: Path, trial_id: str) -> list[Path]:
    """Every table folder of one trial that exists (format 3): what moves with the trial, or is deleted with it.
    Tables comgra does not know (other tools' tables under the same rule) are included."""
    escaped = f"{TRIAL_PARTITION}={escape_partition_value(trial_id)}"
    try:
        roots = sorted(e.name for e in os.scandir(group_dir) if e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [group_dir / root / escaped for root in roots if root != fmt.TRIALS_DIR and not root.startswith(".")
            and (group_dir / root / escaped).is_dir()]


def move_trial_partitions(group_dir: Path, trial_id: str, target: Path | None = None, new_id: str | None = None
                          ) -> None:
    """Move the table folders of one trial: under ``target`` (``target/<table>/trial=<id>``), or renamed to
    ``new_id`` in place. Each is one rename: a reader sees a table whole or not at all."""
    for folder in trial_partitions(group_dir, trial_id):
        table = folder.parent.name
        destination = (target / table / folder.name) if target is not None else \
            folder.parent / f"{TRIAL_PARTITION}={escape_partition_value(str(new_id))}"
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.rename(folder, destination)


# -- rows of format 3 files -------------------------------------------------------------------------------
def to_file(table_name: str, table: pa.Table) -> pa.Table:
    """Rows as a format-3 file holds them: no ``rank`` column, renamed columns (format.FILE_RENAMES)."""
    if "rank" in table.column_names:
        table = table.drop_columns(["rank"])
    renames = fmt.FILE_RENAMES.get(table_name, {})
    if renames:
        table = table.rename_columns([renames.get(name, name) for name in table.column_names])
    return fmt.with_added_columns(table_name, table).cast(fmt.FILE_SCHEMAS[table_name])


def from_file(table_name: str, table: pa.Table, rank: int) -> pa.Table:
    """Rows of a format-3 file as comgra's reader gives them: the names of format.SCHEMAS, ``rank`` added."""
    back = {v: k for k, v in fmt.FILE_RENAMES.get(table_name, {}).items()}
    if back:
        table = table.rename_columns([back.get(name, name) for name in table.column_names])
    if "rank" not in table.column_names:
        table = table.append_column(fmt.RANK_FIELD, pa.repeat(pa.scalar(rank, pa.int32()), table.num_rows))
    return table

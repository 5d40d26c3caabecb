"""The layout of a recording on disk, its schemas and atomic file writes.

A group folder holds one folder per trial::

    GROUP/trials/<trial_id>/
        trial.json                   metadata: format_version, modules, configuration
        graphs/<hash>.json           one dependency graph per distinct structure
        steps/<chunk>.parquet        one row per (training_step, iteration): the commit record
        tensors/<chunk>.parquet      statistics and neuron values
        kpis/<chunk>.parquet         scalars from record_kpi_in_graph
        notes/<chunk>.parquet        lines from add_note

Chunk files are immutable and appear atomically (written under a temporary
name, then renamed). A steps chunk is written after the tensors chunk it
describes, so a reader that sees a step in the index also sees its values.
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

FORMAT_VERSION = 1
TRIALS_DIR = "trials"
TRIAL_META = "trial.json"
TABLES = ("steps", "tensors", "kpis", "notes")
STATISTICS = ("mean", "abs_mean", "std", "min", "max", "abs_max", "nan_count", "inf_count")
AGGREGATIONS = ("mean", "std", "abs_max", "sample", "none")
FORWARD = "forward"

TENSORS_SCHEMA = pa.schema(
    [
        ("training_step", pa.int64()),
        ("kind", pa.string()),  # "forward" or the name of a gradient (loss) group
        ("iteration", pa.int32()),  # -1: parameters and initial values
        ("node", pa.string()),
        ("role", pa.string()),
        ("tensor_name", pa.string()),
        ("tensor_type", pa.string()),  # input, target, loss, parameter, calculated, initial_value
        ("aggregation", pa.string()),  # mean, std, abs_max (over the batch), sample, none
        ("sample", pa.int32()),  # index in the batch for aggregation == "sample", else -1
        ("category", pa.string()),  # dynamic recordings: the sample's category
        ("shape", pa.list_(pa.int32())),
        *[(name, pa.float32()) for name in STATISTICS],
        ("svd_max", pa.float32()),  # largest singular value, 2-D parameters only
        ("num_neurons", pa.int64()),  # size of the value dimensions
        ("neurons", pa.list_(pa.float32())),  # the first values of the flattened tensor
    ]
)
# Small row groups: a query for one step decodes only the few groups whose statistics match.
TENSOR_ROW_GROUP = 1024
# One series (a tensor's statistic across steps) is one contiguous run, and so its rows of one
# step are: both kinds of query decode only the row groups they need.
TENSOR_SORT = [
    ("node", "ascending"), ("role", "ascending"), ("kind", "ascending"), ("iteration", "ascending"),
    ("aggregation", "ascending"), ("sample", "ascending"), ("training_step", "ascending"),
]
STEPS_SCHEMA = pa.schema(
    [
        ("training_step", pa.int64()),
        ("type_of_execution", pa.string()),
        ("iteration", pa.int32()),
        ("graph", pa.string()),  # hash of graphs/<hash>.json
        ("batch_size", pa.int32()),
        ("kinds", pa.list_(pa.string())),
        ("samples", pa.list_(pa.int32())),
        ("categories", pa.list_(pa.string())),
        ("wall_time", pa.float64()),
    ]
)
KPIS_SCHEMA = pa.schema(
    [
        ("kpi_group", pa.string()),
        ("kpi_name", pa.string()),
        ("type_of_execution", pa.string()),
        ("timepoint", pa.int64()),
        ("value", pa.float64()),
    ]
)
NOTES_SCHEMA = pa.schema([("seq", pa.int64()), ("wall_time", pa.float64()), ("note", pa.string())])
SCHEMAS = {"steps": STEPS_SCHEMA, "tensors": TENSORS_SCHEMA, "kpis": KPIS_SCHEMA, "notes": NOTES_SCHEMA}


def trial_dir(group_dir: Path, trial_id: str) -> Path:
    return group_dir / TRIALS_DIR / trial_id


def chunk_name(seq: int, first_step: int = -1, last_step: int = -1, rank: int = 0, level: int = 0) -> str:
    """Chunk names sort by time and carry their step range, so a reader can skip files by name.

    ``level`` > 0 marks a chunk merged from earlier ones (see ``visible_chunks``).
    """
    suffix = f"-l{level}" if level else ""
    return f"{first_step:012d}-{last_step:012d}-r{rank:03d}-{seq:06d}{suffix}.parquet"


def step_range_of(name: str) -> tuple[int, int]:
    first, last = name.split("-")[:2]
    return int(first), int(last)


def _rank_and_level(name: str) -> tuple[str, int]:
    parts = name[: -len(".parquet")].split("-")
    level = int(parts[4][1:]) if len(parts) > 4 and parts[4].startswith("l") else 0
    return parts[2], level


def visible_chunks(paths: list[Path]) -> list[Path]:
    """The chunks a reader uses: a merged chunk hides the parts it was made of.

    The writer first renames the merged chunk into place and then deletes its parts, so
    between the two a reader sees both; this rule keeps it from reading any row twice.
    """
    merged = [(p, *_rank_and_level(p.name), *step_range_of(p.name)) for p in paths]
    covers = [(rank, level, first, last) for _, rank, level, first, last in merged if level > 0]
    if not covers:
        return paths
    return [p for p, rank, level, first, last in merged
            if not any(r == rank and lv > level and f <= first and last <= la for r, lv, f, la in covers)]


def write_json_atomic(path: Path, document: dict[str, Any]) -> None:
    _write_atomic(path, lambda tmp: tmp.write_text(json.dumps(document, separators=(",", ":"))))


def write_parquet_atomic(path: Path, table: pa.Table, row_group_size: int = 4096) -> None:
    _write_atomic(
        path,
        lambda tmp: pq.write_table(
            table, tmp, compression="zstd", row_group_size=row_group_size, write_statistics=True
        ),
    )


def _write_atomic(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkstemp: its files are 0600, and a recording must be readable as the umask allows
    # (a GUI run by another user, a shared results folder).
    tmp = path.parent / f".tmp-{os.getpid()}-{uuid.uuid4().hex}{path.suffix}"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

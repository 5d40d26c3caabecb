"""The layout of a recording on disk, its schemas and atomic file writes.

A group folder holds one folder of JSON documents per trial, and one Hive-partitioned Parquet dataset per
table (format 3; see store/layout.py for the paths and the escaping of trial ids)::

    GROUP/trials/<trial_id>/
        trial.json                   metadata: format_version, modules, configuration (+ world_size)
        rank-<NNN>.json              under torch.distributed: the metadata of each rank but the lowest
        graphs/<hash>.json           one dependency graph per distinct structure
    GROUP/<table>/trial=<escaped trial_id>/rank=<r>/<chunk>.parquet, for each table:
        steps                        one row per (training_step, iteration): the commit record
        tensors                      statistics and neuron values
        kpis                         scalars from record_kpi_in_graph
        notes                        lines from add_note
        layers                       per-layer profiling (track_module(..., profile=True))
        resources                    CPU, memory and GPU samples over time
        runinfo                      per recorded step: module modes, dtypes, optimizer groups, autocast
        sentinels                    per training step (every one): a few reductions of the loss and outputs

Formats 1 and 2 kept each table inside the trial folder (``GROUP/trials/<trial_id>/<table>/<chunk>.parquet``);
they still read, and ``comgra migrate`` rewrites them as format 3 (store/migrate.py).

Chunk files are immutable and appear atomically (written under a temporary
name, then renamed). A steps chunk is written after the tensors chunk it
describes, so a reader that sees a step in the index also sees its values.
Temporary files are named ``.tmp-*.partial``: no documented glob
(``*.parquet``, ``*.json``) ever matches them. A live writer holds an
exclusive ``flock`` on ``.writer-r<rank>.lock`` in the trial folder for its
whole life; the kernel releases it when the process ends, however it ends.
"""
from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import pyarrow as pa
import pyarrow.parquet as pq

# 2: a ``rank`` column in every table (format 1 has none: its rows are rank 0's).
# 3: each table is a Hive-partitioned dataset GROUP/<table>/trial=<id>/rank=<r>/ (see store/layout.py); the files
#    hold no ``rank`` column, and a column name has one type across all tables (FILE_RENAMES).
FORMAT_VERSION = 3
TRIALS_DIR = "trials"
TRIAL_META = "trial.json"
TABLES = ("steps", "tensors", "kpis", "notes", "layers", "resources", "runinfo", "sentinels")
STATISTICS = ("mean", "abs_mean", "std", "min", "max", "abs_max", "nan_count", "inf_count")
AGGREGATIONS = ("mean", "std", "abs_max", "sample", "none")
FORWARD = "forward"
# The torch.distributed rank that wrote a row: plain readers of the shared globs can tell ranks apart.
RANK_FIELD = pa.field("rank", pa.int32())

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
# Per-layer profiling (track_module(..., profile=True)): one row per execution of a module. Times are
# seconds; a null is "not measured on this step" (activation statistics and gradient norms on the
# recorded steps, FLOPs on the steps asked for), never a guess.
LAYERS_SCHEMA = pa.schema(
    [
        ("training_step", pa.int64()),
        ("module", pa.string()),  # dotted name: root.sub.subsub
        ("call", pa.int32()),  # the how-manieth execution of the module in this step, from 0
        ("clock", pa.string()),  # "perf_counter" (CPU) or "cuda_event" (GPU, read once per step)
        ("forward_start", pa.float64()),  # seconds since the epoch (time.time scale)
        ("forward_time", pa.float64()),
        ("backward_start", pa.float64()),
        ("backward_time", pa.float64()),  # gradient at the outputs -> last gradient of its parameters/inputs
        ("output_bytes", pa.int64()),  # bytes of the tensors the module returned
        ("cuda_allocated_delta", pa.int64()),  # torch.cuda.memory_allocated() after - before the forward
        ("cuda_peak", pa.int64()),  # torch.cuda.max_memory_allocated() after the forward (process-wide)
        ("forward_flops", pa.int64()),  # FlopCounterMode, inclusive of submodules
        ("act_mean", pa.float32()),  # statistics of the first floating-point output
        ("act_std", pa.float32()),
        ("act_abs_max", pa.float32()),
        ("act_nan_count", pa.int64()),
        ("grad_norm", pa.float32()),  # L2 norm of the gradients of the module's parameters (submodules too)
    ]
)
# Resource samples (psutil, NVML), long format: one row per (time, source, metric).
RESOURCES_SCHEMA = pa.schema(
    [
        ("wall_time", pa.float64()),
        ("training_step", pa.int64()),  # the last training step started when sampled; -1 before the first
        ("source", pa.string()),  # "process", "machine" or "gpu:<index>"
        ("metric", pa.string()),  # cpu_percent, memory_bytes, memory_percent, utilization_percent, ...
        ("value", pa.float64()),
    ]
)
# The run's state on each recorded step, long format: one row per (subject, field). Subjects: "module" (fields
# mode: train/eval, type), "parameter" (dtype, requires_grad, optimizer group: "" for none, the float64 value
# fingerprints value_sum, value_norm, grad_sum, grad_norm), "tensor" (dtype, requires_grad), "optimizer_group"
# (lr, weight_decay, parameters), "autocast" (per device type: enabled, dtype), "step" (batch_size, grad_enabled).
RUNINFO_SCHEMA = pa.schema(
    [
        ("training_step", pa.int64()),
        ("type_of_execution", pa.string()),
        ("subject", pa.string()),
        ("name", pa.string()),
        ("field", pa.string()),
        ("value", pa.string()),  # the value as text (numbers too)
        ("number", pa.float64()),  # the value as a number, where it is one
    ]
)
# Every-step sentinels: a few reductions of the tensors a run marks (by default its losses and outputs), on every
# training step, recorded or not. ``event`` names what went wrong on that step (nan, inf, zero_batch, empty),
# null when nothing did.
SENTINELS_SCHEMA = pa.schema(
    [
        ("training_step", pa.int64()),
        ("type_of_execution", pa.string()),
        ("name", pa.string()),  # the registered tensor, or "batch" for the batch size
        ("source", pa.string()),  # loss, output, input (inputs and targets), marked, batch
        ("numel", pa.int64()),
        ("has_nan", pa.bool_()),
        ("has_inf", pa.bool_()),
        ("abs_max", pa.float64()),
        ("norm", pa.float64()),
        ("recorded", pa.bool_()),  # whether the policy recorded this step in full
        ("event", pa.string()),
    ]
)
# Columns added to a table after format 3 shipped. Chunks written before lack them, and so may the rows a tool hands
# the writer (the *_SCHEMA above): both read them as nulls. kpis' wall_time: when the point was recorded (seconds
# since the epoch), the Graphs tab's wall-time and relative-time x-axes.
# sentinels' value_min and value_max: the smallest and largest value of the step's tensor (an input all zeros, or
# constant, on some steps: analysis.sentinel_events).
# tensors' type_of_execution: the type of the step the row belongs to. A step is (training_step, type_of_execution):
# an evaluation may share its number with a training step (the Trainer's ``global_step``). A null (every chunk
# written before the column) is the type the steps table gives that step number, which was unique then.
ADDED_COLUMNS: dict[str, tuple[pa.Field, ...]] = {"kpis": (pa.field("wall_time", pa.float64()),),
                                                  "layers": (pa.field("type_of_execution", pa.string()),),
                                                  "sentinels": (pa.field("value_min", pa.float64()),
                                                                pa.field("value_max", pa.float64())),
                                                  "tensors": (pa.field("type_of_execution", pa.string()),)}
# The *_SCHEMA above are the rows the recorder hands to its writer; SCHEMAS are the chunk files on disk:
# the same columns, the added ones, plus ``rank``, which the writer adds (it alone knows which rank's shard it writes).
SCHEMAS = {name: pa.schema([*schema, *ADDED_COLUMNS.get(name, ()), RANK_FIELD]) for name, schema in
           {"steps": STEPS_SCHEMA, "tensors": TENSORS_SCHEMA, "kpis": KPIS_SCHEMA, "notes": NOTES_SCHEMA,
            "layers": LAYERS_SCHEMA, "resources": RESOURCES_SCHEMA, "runinfo": RUNINFO_SCHEMA,
            "sentinels": SENTINELS_SCHEMA}.items()}


def added_column_names(table_name: str) -> tuple[str, ...]:
    return tuple(field.name for field in ADDED_COLUMNS.get(table_name, ()))


def with_added_columns(table_name: str, table: pa.Table) -> pa.Table:
    """``table`` with the ADDED_COLUMNS of ``table_name`` it lacks appended as nulls (a chunk written before them)."""
    for field in ADDED_COLUMNS.get(table_name, ()):
        if field.name not in table.column_names:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table
# Format 3 on disk: a column name has one type across every table, so that an engine merges the schemas of the whole
# group (Spark's mergeSchema). Two names had two types before: runinfo's text ``value`` (kpis and resources hold a
# float64 ``value``) and sentinels' float64 ``abs_max`` (tensors hold a float32 one). comgra's reader gives the
# rows back under the names above; the files name them as here.
FILE_RENAMES = {"runinfo": {"value": "text"}, "sentinels": {"abs_max": "abs_max_f64"}}
# The chunk files of format 3: the columns the recorder hands its writer, renamed as above, no ``rank``.
FILE_SCHEMAS = {name: pa.schema([field.with_name(FILE_RENAMES.get(name, {}).get(field.name, field.name))
                                 for field in schema if field.name != "rank"]) for name, schema in SCHEMAS.items()}



# -- the graph document (graphs/<hash>.json), as typed structures ------------------------------------------
class _GraphNodeFields(TypedDict):
    id: str  # unique in the graph; "<node>*old" for a tensor of an earlier iteration
    node: str  # the node's name in the tensors table
    role: str  # input, target, loss, output, parameter, intermediate, initial_value
    roles: list[str]  # the tensors within the node (their ``role`` in the tensors table)
    column: int  # layout: columns left to right by dependency
    row: int


class GraphNode(_GraphNodeFields, total=False):
    tensor_type: str
    has_batch: bool
    iteration_offset: int  # negative for a tensor of an earlier iteration
    absolute_iteration: int | None  # -1 for parameters and initial values (stored under iteration -1)
    group: str  # the visual prefix of a parameter
    aliases: list[str]  # a tied parameter's other names


class _GraphEdgeFields(TypedDict):
    source: str  # node ids
    target: str


class GraphEdge(_GraphEdgeFields, total=False):
    source_role: str
    target_role: str


class _GraphDocumentFields(TypedDict):
    nodes: list[GraphNode]
    edges: list[GraphEdge]


class GraphDocument(_GraphDocumentFields, total=False):
    """One dependency graph of an iteration; the reader returns it once it has checked these fields."""

    format_version: int
    hash: str


def trial_dir(group_dir: Path, trial_id: str) -> Path:
    return group_dir / TRIALS_DIR / trial_id


def chunk_name(seq: int, first_step: int = -1, last_step: int = -1, rank: int = 0, level: int = 0) -> str:
    """Chunk names sort by time and carry their step range, so a reader can skip files by name.

    ``level`` > 0 marks a chunk merged from earlier ones (see ``visible_chunks``).
    """
    suffix = f"-l{level}" if level else ""
    return f"{first_step:012d}-{last_step:012d}-r{rank:03d}-{seq:06d}{suffix}.parquet"


# first step - last step - rank - sequence number [- merge level]: what chunk_name writes.
_CHUNK_NAME = re.compile(r"(\d+)-(\d+)-r(\d+)-(\d+)(?:-l(\d+))?\.parquet")


@dataclass(frozen=True)
class ChunkName:
    """What a chunk's name says about it (see ``chunk_name``)."""

    first: int
    last: int
    rank: int
    seq: int
    level: int


def parse_chunk_name(name: str) -> ChunkName | None:
    """The parts of a chunk's name; None for a file not named as the writer names chunks (a foreign one)."""
    match = _CHUNK_NAME.fullmatch(name)
    if match is None:
        return None
    return ChunkName(int(match[1]), int(match[2]), int(match[3]), int(match[4]), int(match[5] or 0))


def is_chunk_name(name: str) -> bool:
    """Whether a file is named as the writer names chunks; any other file in a table folder is foreign."""
    return parse_chunk_name(name) is not None


def step_range_of(name: str) -> tuple[int, int]:
    """The steps a chunk holds; a foreign name holds none (an empty range), so it never raises."""
    chunk = parse_chunk_name(name)
    return (chunk.first, chunk.last) if chunk else (0, -1)


def rank_of(name: str) -> int | None:
    """The rank in a chunk name (``-r001-``), or None for a file that is no chunk."""
    chunk = parse_chunk_name(name)
    return chunk.rank if chunk else None


def seq_of(name: str) -> int:
    """The writer's sequence number in a chunk name, or -1 for a file that is no chunk."""
    chunk = parse_chunk_name(name)
    return chunk.seq if chunk else -1


def visible_chunks(paths: list[Path]) -> list[Path]:
    """The chunks a reader uses: a merged chunk hides the parts it was made of.

    The writer first renames the merged chunk into place and then deletes its parts, so
    between the two a reader sees both; this rule keeps it from reading any row twice.
    """
    # A foreign file is no chunk: never read, never hides one.
    chunks = [(p, c) for p in paths if (c := parse_chunk_name(p.name)) is not None]
    covers = [c for _, c in chunks if c.level > 0]
    if not covers:
        return [p for p, _ in chunks]
    # A part is older than the chunk merged from it (lower seq): a later chunk whose range happens to
    # lie inside (KPIs at a repeated timepoint, notes) is never hidden.
    return [p for p, c in chunks
            if not any(m.rank == c.rank and m.level > c.level and m.first <= c.first and c.last <= m.last
                       and m.seq > c.seq for m in covers)]


# fsync every file before it is renamed into place, and its folder after: after a power loss a chunk
# is whole under its final name or absent, and every chunk that was renamed survives. Costs a few
# milliseconds per chunk (chunks are written every few seconds); the test suite turns it off.
DURABLE_WRITES = True
TEMP_PREFIX = ".tmp-"
TEMP_SUFFIX = ".partial"


def is_temporary(name: str) -> bool:
    """A file that a writer was still writing (or that a crash left behind)."""
    return name.startswith(TEMP_PREFIX)


def final_name_of_temporary(name: str) -> str:
    """The name a temporary file would have been renamed to (``.tmp-<pid>-<hex>-<name>.partial``)."""
    inner = name[len(TEMP_PREFIX):]
    if inner.endswith(TEMP_SUFFIX):
        inner = inner[: -len(TEMP_SUFFIX)]
    parts = inner.split("-", 2)
    return parts[2] if len(parts) == 3 else ""


def folder_identity(directory: Path) -> tuple[int, int] | None:
    """(device, inode) of a folder, None where it is gone: a folder put in its place under the same name differs."""
    try:
        status = os.stat(directory)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def writer_lock_path(trial_directory: Path, rank: int) -> Path:
    return trial_directory / f".writer-r{rank:03d}.lock"


def chunk_names(folder: Path) -> list[str]:
    """The names of ``chunk_files(folder)``, from one ``scandir`` (no stat per file): cheap enough to ask on every
    view, and a version token (a new chunk changes the list)."""
    try:
        return sorted(e.name for e in os.scandir(folder) if e.name.endswith(".parquet") and e.name[0] != ".")
    except (FileNotFoundError, NotADirectoryError):
        return []


def chunk_files(folder: Path) -> list[Path]:
    """The ``*.parquet`` files of one table folder, sorted, temporary and hidden files left out."""
    return [folder / name for name in chunk_names(folder)]


def settled_chunk_files(folder: Path, attempts: int = 8) -> list[Path]:
    """``chunk_files(folder)`` from a listing that two folder reads in a row agree on. A folder read is no snapshot:
    a merged chunk renamed into place while it runs can be missed, and the parts it replaces, deleted meanwhile,
    missed too; their steps would then be absent from one answer (the reader's queries list with this)."""
    names = chunk_names(folder)
    for _ in range(attempts):
        again = chunk_names(folder)
        if again == names:
            break
        names = again
    return [folder / name for name in names]


def write_json_atomic(path: Path, document: dict[str, Any]) -> None:
    _write_atomic(path, lambda tmp: tmp.write_text(json_text(document)))


def json_text(document: dict[str, Any]) -> str:
    """A JSON document as the recording stores it (compact)."""
    return json.dumps(document, separators=(",", ":"))


# Every page carries a CRC-32 of its bytes (``write_page_checksum``), checked on every read
# (``page_checksum_verification``): without it a flipped bit in a compressed page can decode to other
# values with no error at all. Chunks of older comgra have no checksums and still read (nothing to check).
PAGE_CHECKSUMS = True

def write_parquet_atomic(path: Path, table: pa.Table, row_group_size: int = 4096) -> None:
    _write_atomic(
        path,
        lambda tmp: pq.write_table(
            table, tmp, compression="zstd", row_group_size=row_group_size, write_statistics=True,
            use_dictionary=dictionary_columns(table.schema), write_page_checksum=PAGE_CHECKSUMS,
        ),
    )


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns worth a dictionary: names, kinds, steps repeat; statistics and neuron values almost
    never do, and a dictionary of unique floats is work and bytes for nothing (measured on ResNet-18's
    tensors chunks: 6.1 ms and 144 KB per recorded step with dictionaries everywhere, 2.3 ms and 96 KB
    without them for float columns)."""
    def floating(kind: pa.DataType) -> bool:
        return pa.types.is_floating(kind) or (pa.types.is_list(kind) and pa.types.is_floating(kind.value_type))
    return [field.name for field in schema if not floating(field.type)]


def _write_atomic(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkstemp: its files are 0600, and a recording must be readable as the umask allows
    # (a GUI run by another user, a shared results folder).
    tmp = write_temporary(path, write)
    try:
        # Durable before visible: after a power loss a file is either whole under its final name or absent.
        if DURABLE_WRITES:
            _fsync(tmp, os.O_RDONLY)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if DURABLE_WRITES:
        _fsync(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))  # the rename itself


def write_temporary(path: Path, write: Any) -> Path:
    """A new temporary file beside ``path`` (``.tmp-<pid>-<hex>-<name>.partial``) filled by ``write(tmp)``, to be
    renamed to ``path`` by the caller; removed again where ``write`` fails."""
    # The suffix is not the final one, so globs such as tensors/*.parquet never match a file being written.
    tmp = path.parent / f"{TEMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}-{path.name}{TEMP_SUFFIX}"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        write(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _fsync(path: Path, flags: int) -> None:
    descriptor = os.open(path, flags)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)

"""A recorder's link to its trial on disk, and the step being recorded.

Faults of comgra's own (a folder that cannot be written, a full disk, a bug
in the capture code) are reported once with a warning and switch recording
off; the training goes on.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import torch

from comgra.capture.checkpointing import recomputing
from comgra.capture.kpis import KpiBuffer
from comgra.capture.modules import ModuleTracker, parameter_nodes
from comgra.capture.options import RecorderOptions
from comgra.capture.ranks import RankInfo
from comgra.capture.registry import RECORDING_TYPES, Registration
from comgra.capture.sharded import ShardCombiner, StepShards
from comgra.capture.step import LaterRows, StepOptions, StepRecording
from comgra.capture.summaries import SampleChoice, prepare
from comgra.errors import RecordingError, disk_problem
from comgra.objects import DecisionMakerForRecordings
from comgra.store import format as fmt
from comgra.store import layout
from comgra.store import spool
from comgra.store.uploader import Uploader
from comgra.store import hyperparameters as hyperparameter_store
from comgra.store.writer import ChunkWriter


class ComgraWarning(UserWarning):
    """Something the user should know that does not stop the recording (or the training)."""


@dataclass
class Session:
    options: RecorderOptions
    directory: Path
    writer: ChunkWriter | None
    metadata: dict[str, Any]
    broken: bool = False
    step: StepRecording | None = None
    per_sample_default: bool = True
    graphs_written: set[str] = field(default_factory=set)
    graphs_of_step: dict[str, dict[str, Any]] = field(default_factory=dict)  # new graphs, written at finish_step
    warned: set[str] = field(default_factory=set)
    parameter_names: dict[str, tuple[str, str]] = field(default_factory=dict)
    modules: ModuleTracker | None = None
    notes_written: int = 0
    kpis_flushed_at: float = 0.0
    closed: bool = False
    metadata_name: str = fmt.TRIAL_META  # trial.json for the lead rank, rank-NNN.json for the others
    on_graph: Any = None  # told each recorded iteration's graph document (the sentinels learn the outputs)
    on_flush: Any = None  # called before a flush (the sentinels hand over their rows)
    combiner: ShardCombiner | None = None  # DTensors across ranks (capture/sharded.py), made at the first step
    uploader: Uploader | None = None  # a URL root: sends the spool's closed files there (store.uploader)
    hyperparameters: dict[str, Any] = field(default_factory=dict)  # record_hyperparameters, merged

    @classmethod
    def open(cls, options: RecorderOptions, version: str, ranks: RankInfo = RankInfo(0, 1)) -> Session:
        directory = fmt.trial_dir(options.group_dir, options.trial_id)
        metadata_name = fmt.TRIAL_META if ranks.rank == options.lead_rank else f"rank-{ranks.rank:03d}.json"
        metadata = {"format_version": fmt.FORMAT_VERSION, "trial_id": options.trial_id, "group": options.group,
                    "created": time.time(), "comgra_version": version, "modules": [], "types_of_execution": [],
                    "config": {"max_num_batch_size_to_record": options.max_samples,
                               "max_num_neurons_to_record": options.max_neurons,
                               "prefixes_for_grouping_module_parameters_visually": list(options.visual_prefixes),
                               "prefixes_for_grouping_module_parameters_in_nodes": list(options.node_prefixes)}}
        if ranks.world_size > 1:
            metadata.update(rank=ranks.rank, world_size=ranks.world_size)
        try:
            if ranks.world_size > 1:
                _move_aside_earlier_shard(options.group_dir, directory, ranks, metadata_name == fmt.TRIAL_META)
            else:
                _move_aside_earlier_trial(options.group_dir, directory)
            directory.mkdir(parents=True, exist_ok=True)
            fmt.write_json_atomic(directory / metadata_name, metadata)
            writer = ChunkWriter(directory, flush_seconds=options.flush_seconds, rank=ranks.rank)
            uploader = None if options.remote_group is None else \
                spool.start_upload(options.group_dir, options.remote_group, options.settings, options.trial_id)
            if uploader is not None:
                writer.on_written = uploader.wake  # a pass after each flush, and none while nothing is written
            prepare()  # the first recorded step's one-time costs, before the training loop
        except OSError as error:
            session = cls(options, directory, None, metadata, broken=True)
            _warn(f"comgra cannot write to {str(directory)!r} ({error}); recording is off, training goes on. "
                  "Pass a writable comgra_root_path.")
            return session
        return cls(options, directory, writer, metadata, metadata_name=metadata_name, uploader=uploader)

    # -- metadata, notes, KPIs ----------------------------------------------------------------
    def set_modules(self, modules: ModuleTracker) -> None:
        self.modules = modules
        self.parameter_names = parameter_nodes(list(modules.parameters), list(self.options.visual_prefixes),
                                               list(self.options.node_prefixes))
        self.metadata["modules"] = modules.trees
        self._put_json(self.metadata_name, self.metadata)

    def record_hyperparameters(self, values: dict[str, Any]) -> None:
        """Merge ``values`` into the trial's hyperparameters (later values win) and write them
        (``store.hyperparameters``). The lead rank writes; a failed write is warned about, the training goes on."""
        self.hyperparameters.update(values)
        if self.writer is None or self.broken or self.metadata_name != fmt.TRIAL_META:
            return
        try:
            hyperparameter_store.write(self.options.group_dir, self.options.trial_id, self.hyperparameters)
        except OSError as error:
            self.warn_once("hyperparameters", f"comgra cannot write the hyperparameters of trial "
                                              f"{self.options.trial_id!r} ({error}); training goes on.")

    def add_note(self, note: str) -> None:
        self.notes_written += 1
        self._put_table("notes", pa.table({"seq": [self.notes_written], "wall_time": [time.time()], "note": [note]},
                                          schema=fmt.NOTES_SCHEMA))

    def flush_kpis(self, buffer: KpiBuffer, *, force: bool) -> None:
        """KPI points go to the writer in batches: at least every ``flush_seconds``, or per 256 points."""
        now = time.monotonic()
        if force or len(buffer.rows) >= 256 or (buffer.rows and now - self.kpis_flushed_at >= self.options.flush_seconds):
            self.kpis_flushed_at = now
            table = buffer.take()
            if table is not None:
                self._put_table("kpis", table)

    # -- one training step ------------------------------------------------------------------
    def start_step(self, training_step: int, batch_size: int, type_of_execution: str | None,
                   modules: ModuleTracker, per_sample_default: bool) -> bool:
        if self.broken:
            return False
        self.graphs_of_step.clear()
        options = StepOptions(self.options.max_neurons, self.options.with_svd, self.options.max_samples)
        if self.combiner is None:
            self.combiner = ShardCombiner.for_ranks(self.options.record_ranks, self.warn_once)
        self.step = StepRecording(training_step, batch_size, type_of_execution, options, parameter_aliases=modules.aliases,
                                  report=self.warn_once, dtensors=StepShards(self.combiner, options.max_neurons))
        self.per_sample_default = per_sample_default
        names = self.parameter_names  # a tied parameter once, under its first name
        self.step.register_parameters([Registration(name, -1, names[name][0], name, "parameter", "neuron", None, False,
                                                    tuple(parameter.shape), parameter)
                                       for name, parameter in modules.parameters.items()])
        return True

    def register(self, tensor_name: str, tensor: torch.Tensor, *, index_of_batch_dimension: int | None,
                 flags: dict[str, bool], recording_type: str | None, record_per_batch_index: bool | None,
                 node_name: str | None, role_within_node: str | None, watched: bool = False,
                 module_type: str = "") -> None:
        """``watched``: a module output found by comgra.watch (see ``ComgraRecorder._register_watched``);
        ``module_type``: that module's class, shown beside the node's name."""
        step = self.step
        assert step is not None
        if watched and recomputing():  # a module's forward hook, run again by torch.utils.checkpoint's recomputation
            return step.checkpoints.recomputed(step, tensor_name, tensor, takeover=True)
        registration = _registration(step, tensor_name, tensor, index_of_batch_dimension, flags, recording_type,
                                     self.per_sample_default if record_per_batch_index is None else record_per_batch_index,
                                     node_name, role_within_node)
        # Made inside a reentrant checkpoint's forward pass, under no_grad: it waits for the recomputation
        # (capture/checkpointing.py), and is made a leaf that wants a gradient only where it is the function's input.
        without_grad = not torch.is_grad_enabled() and tensor.grad_fn is None and not tensor.requires_grad
        region = step.checkpoints.reentrant_forward(tensor_name) if not torch.is_grad_enabled() else None
        if region is not None and not without_grad:
            region = None
        elif region is None and without_grad:  # perhaps inside another library's checkpoint
            step.checkpoints.made_without_grad(registration)
        if tensor.is_floating_point() or tensor.is_complex():
            if not tensor.requires_grad and tensor.grad_fn is None and (region is None or region.is_argument(tensor)):
                tensor.requires_grad_(True)  # so that its gradient can be recorded; undone at finish_batch
                step.switched_on_grad.append(tensor)
        else:
            self.warn_once(f"dtype:{tensor_name}",
                           f"Tensor {tensor_name!r} has dtype {tensor.dtype}, which cannot carry gradients: its values "
                           "are recorded, its gradients are not, and the graph cannot see what it feeds. Connect it with "
                           f"comgra.my_recorder.add_tensor_connection({tensor_name!r}, <tensor computed from it>).")
        registration.tensor = tensor
        registration.module_type = module_type
        if watched:
            self.warned.add(f"unconnected:{tensor_name}")
        step.register(registration, tensor, takeover=watched, region=region)

    def recomputed(self, tensor_name: str, tensor: torch.Tensor) -> None:
        """``register_tensor`` called again by activation checkpointing's recomputation (capture/checkpointing.py)."""
        if self.step is not None:
            self.step.checkpoints.recomputed(self.step, tensor_name, tensor)

    def finish_iteration(self) -> None:
        step = self.step
        assert step is not None
        groups = {name: group for name, (_, group) in self.parameter_names.items()}
        document, unconnected = step.finish_iteration(groups)
        if self.on_graph is not None:
            self.on_graph(document)
        if document["hash"] not in self.graphs_written:  # written with the step: an abandoned step leaves none
            self.graphs_of_step[document["hash"]] = document
        for name in unconnected:
            if getattr(step, "replayed", False):
                break  # recorded from a breakpoint's replay: an input registered late has no edge; not the user's fault
            if f"dtype:{name}" in self.warned:
                continue  # its dtype warning already gave the same advice: one warning per problem
            self.warn_once(f"unconnected:{name}",
                           f"Tensor {name!r} has no connection to any other registered tensor in iteration "
                           f"{step.iteration} of step {step.training_step}. That is fine for a helper value; to draw "
                           f"an edge, call comgra.my_recorder.add_tensor_connection(<source>, {name!r}).")

    def decide(self, wanted: bool, type_of_execution: str | None, categories: list[Any]) -> bool:
        step = self.step
        assert step is not None
        if len(categories) != step.batch_size:
            raise RecordingError(f"category_per_sample has {len(categories)} entries but the batch has "
                                 f"{step.batch_size} samples; give one category per sample.")
        if not wanted:
            self.abandon_step()
            return False
        step.type_of_execution = type_of_execution
        step.choice = _balanced_choice([str(c) for c in categories], self.options.max_samples)
        return True

    def finish_step(self, policy: DecisionMakerForRecordings) -> None:
        step = self.step
        assert step is not None
        try:
            choice = getattr(step, "choice", None) or SampleChoice(
                list(range(min(step.batch_size, step.batch_size if self.options.max_samples is None
                               else self.options.max_samples))))
            # On the CPU the rows are built on the writer's thread (capture/step.py, LATER_UP_TO_BYTES)
            writer = self.writer if not self.broken else None
            made = step.to_tables(choice, later=writer.takes_later if writer is not None else None)
            for graph_hash, document in self.graphs_of_step.items():
                self.graphs_written.add(graph_hash)
                self._put_json(f"graphs/{graph_hash}.json", document)
            if isinstance(made, LaterRows):
                self.writer.put_later(("tensors", "steps"), made.build, made.size)  # type: ignore[union-attr]
                self._check_writer()
            else:
                self._put_table("tensors", made[0])
                self._put_table("steps", made[1])
            policy.mark_recording_on_this_step(step.training_step, step.type_of_execution)  # type: ignore[arg-type]
        finally:
            self.abandon_step()

    def abandon_step(self) -> None:
        """Let go of the step in progress; what it held never reaches the writer."""
        self.graphs_of_step.clear()
        if self.step is not None:
            self.step.close()
            self.step = None

    def flush(self, timeout: float | None) -> None:
        """Wait until everything handed to the writer so far is on disk (or ``timeout`` seconds passed)."""
        if self.writer is not None and not self.broken and not self.closed:
            if self.on_flush is not None:
                self.on_flush()
            self.writer.flush(timeout)
            self._check_writer()

    def close(self, types_of_execution: list[str]) -> None:
        if self.closed or self.writer is None:
            return
        self.closed = True
        self.metadata["types_of_execution"] = types_of_execution
        self.metadata["finished"] = time.time()  # the Runs view's "finished" (service.runs): finalize ran
        self._put_json(self.metadata_name, self.metadata)
        self.writer.close()
        self._check_writer()
        if self.uploader is not None:  # bounded by [storage] upload_timeout_s; what is left stays in the spool
            message = spool.finish_upload(self.uploader, self.options.settings)
            if message is not None:
                _warn(message)
            elif not getattr(getattr(self.options.settings, "storage", None), "keep_uploaded", True):
                try:  # all in the bucket: the node's disk is given back
                    spool.remove_uploaded(self.uploader, self.options.trial_id, self.writer.rank)
                except OSError as error:  # a fault of the clean-up never reaches the training
                    _warn(f"comgra could not remove the uploaded files of {self.options.trial_id!r} from the spool "
                          f"{str(self.uploader.local)!r}: {error}")

    # -- plumbing ---------------------------------------------------------------------------------
    def put_table(self, name: str, table: pa.Table) -> None:
        """Hand a table of rows to the writer (``capture.evidence`` and the sentinels write theirs so)."""
        self._put_table(name, table)

    def put_later(self, name: str, make: Callable[[], pa.Table], size: int = 0) -> None:
        """The table ``make()`` builds, built on the writer's thread where the writer takes ``size`` more bytes now
        (store/writer.py, ``put_later``), else here and now."""
        writer = self.writer
        if writer is not None and not self.broken and writer.takes_later(size):
            writer.put_later((name,), lambda: (make(),), size)
            self._check_writer()
        else:
            self._put_table(name, make())

    def _put_table(self, name: str, table: pa.Table) -> None:
        if self.writer is not None and not self.broken and table.num_rows:
            self.writer.put_table(name, table)
            self._check_writer()

    def _put_json(self, relative_path: str, document: dict[str, Any]) -> None:
        if self.writer is not None and not self.broken:
            self.writer.put_json(relative_path, document)
            self._check_writer()

    def _check_writer(self) -> None:
        if self.writer is not None and self.writer.error is not None and not self.broken:
            report_fault(self, self.writer.error)
        if self.uploader is not None and self.uploader.full and not self.broken:
            report_fault(self, spool.SpoolFull(spool.spool_full_message(self.uploader)))

    def warn_once(self, key: str, message: str) -> None:
        if key in _FAULTS_OF_THE_TRIAL_FOLDER:
            # The run state goes to the trial folder, as the chunks do: a full disk or a read-only folder is one
            # fault, reported once (by whichever meets it first) and it ends the recording.
            report_fault(self, OSError(message))
            return
        if key not in self.warned:
            self.warned.add(key)
            _warn(message)


# warn_once keys of failures to write into the trial folder outside the writer (live.breakpoints publishes run.json).
_FAULTS_OF_THE_TRIAL_FOLDER = frozenset({"bp-publish"})


def report_fault(session: Session, error: BaseException) -> None:
    """Report a fault of comgra's own once and stop recording; the training goes on."""
    if session.broken:
        return
    session.broken = True
    session.abandon_step()
    disk = disk_problem(error)  # a full or read-only disk is said as such, not as a fault of comgra's
    cause = f"because {disk}" if disk else f"after an internal error: {type(error).__name__}: {error}"
    _warn(f"comgra stopped recording trial {session.options.trial_id!r} {cause}. Training goes on; steps flushed "
          f"before this are readable in {str(session.directory)!r}.")


def _warn(message: str) -> None:
    warnings.warn(message, ComgraWarning, stacklevel=_stacklevel_of_caller())


_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])


def _stacklevel_of_caller() -> int:
    """The stack level of the first frame outside comgra, so a warning names the user's line."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


def _move_aside_earlier_trial(group_dir: Path, directory: Path) -> None:
    """The original deleted an existing trial folder; we keep it under GROUP/.replaced/."""
    if (directory.exists() and any(directory.iterdir())) or layout.trial_partitions(group_dir, directory.name):
        target = group_dir / ".replaced" / f"{directory.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        target.parent.mkdir(parents=True, exist_ok=True)
        if directory.exists():
            shutil.move(str(directory), str(target))
        # Format 3: the trial's tables live outside its folder; they go with it (target/<table>/trial=<id>/).
        layout.move_trial_partitions(group_dir, directory.name, target=target)
        print(f"comgra: an earlier recording of trial {directory.name!r} was moved to {str(target)!r}",
              file=sys.stderr)


def _move_aside_earlier_shard(group_dir: Path, directory: Path, ranks: RankInfo, lead: bool) -> None:
    """One rank of a torch.distributed run: move aside only the files of an earlier run that this rank owns.

    The ranks start at the same time and never wait for each other, so moving the whole folder
    (as a single process does) could take another rank's fresh files away. A rank owns its own
    chunks and metadata; the lead rank also owns trial.json and what ranks beyond the world size
    left. graphs/ stays: a graph is named by its content, so an earlier file is the same file.
    """
    owners = {path: _owner(path.name, ranks.world_size) for path in _shard_files(directory)}
    owned = [path for path, owner in owners.items() if owner == ranks.rank or (lead and owner is None)]
    if not owned:
        return
    target = group_dir / ".replaced" / (f"{directory.name}-{time.strftime('%Y%m%d-%H%M%S')}-"
                                        f"r{ranks.rank:03d}-{os.getpid()}")
    for path in owned:
        destination = target / (path.relative_to(directory) if path.is_relative_to(directory)
                                 else path.relative_to(group_dir))  # format 3: <table>/trial=<id>/rank=<r>/...
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(destination))
    print(f"comgra: rank {ranks.rank} moved its part of an earlier recording of trial {directory.name!r} to "
          f"{str(target)!r}", file=sys.stderr)


def _shard_files(directory: Path) -> list[Path]:
    """Metadata and chunks; never a dot file: another rank's temporary file may be in flight."""
    files = list(directory.glob("*.json")) + [p for table in fmt.TABLES for version in (2, 3)
                                              for folder in layout.table_dirs(directory, table, version)
                                              for p in fmt.chunk_files(folder)]
    return [p for p in files if not p.name.startswith(".") and p.is_file()]


def _owner(name: str, world_size: int) -> int | None:
    """The rank that owns a file, or None where only the lead rank may touch it (trial.json, leftovers)."""
    if name.startswith("rank-") and name.endswith(".json"):
        number = name[len("rank-"):-len(".json")]
        owner = int(number) if number.isdigit() else None
    elif name.endswith(".parquet"):
        owner = fmt.rank_of(name)
    else:
        owner = None
    return owner if owner is not None and owner < world_size else None


def _registration(step: StepRecording, tensor_name: str, tensor: torch.Tensor, batch_dim: int | None,
                  flags: dict[str, bool], recording_type: str | None, per_sample: bool,
                  node_name: str | None, role_within_node: str | None) -> Registration:
    if not isinstance(tensor, torch.Tensor):
        raise RecordingError(f"register_tensor({tensor_name!r}, ...) needs a torch.Tensor, got {type(tensor).__name__}.")
    if not isinstance(tensor_name, str) or not tensor_name or "*" in tensor_name:
        raise RecordingError(f"tensor_name={tensor_name!r} must be a non-empty string without '*'.")
    kinds = [k for k in ("is_input", "is_parameter", "is_target", "is_loss") if flags[k]]
    if len(kinds) > 1:
        raise RecordingError(f"register_tensor({tensor_name!r}) got {' and '.join(kinds)}; set at most one of "
                             "is_input, is_parameter, is_target, is_loss.")
    if recording_type is not None and recording_type not in RECORDING_TYPES:
        raise RecordingError(f"register_tensor({tensor_name!r}, recording_type={recording_type!r}): unknown "
                             f"recording_type; use one of {list(RECORDING_TYPES)} or None for the default.")
    tensor_type = kinds[0][3:] if kinds else ("initial_value" if flags["is_initial_value"] else "calculated")
    if tensor_type in ("loss", "parameter"):
        recording_type, batch_dim = ("single_value" if tensor_type == "loss" else recording_type or "kpis"), None
    shape = _shape(tensor)
    if shape is None:  # a nested tensor: no batch dimension to check; its values are not summarised (summaries.py)
        shape, batch_dim = (), None
    if batch_dim is not None:
        if not -tensor.dim() <= batch_dim < tensor.dim():
            raise RecordingError(f"register_tensor({tensor_name!r}): index_of_batch_dimension={batch_dim} does not "
                                 f"exist in shape {tuple(tensor.shape)}; pass index_of_batch_dimension=None for a tensor "
                                 "without a batch dimension.")
        batch_dim %= tensor.dim()
        if tensor.shape[batch_dim] != step.batch_size:
            raise RecordingError(f"register_tensor({tensor_name!r}): dimension {batch_dim} of shape "
                                 f"{tuple(tensor.shape)} is {tensor.shape[batch_dim]}, but start_batch() was given "
                                 f"current_batch_size={step.batch_size}. Pass the right index_of_batch_dimension, or None "
                                 "if the tensor has no batch dimension.")
    iteration = -1 if flags["is_initial_value"] else step.iteration
    return Registration(tensor_name, iteration, node_name or tensor_name, role_within_node or tensor_name, tensor_type,
                        recording_type or "neuron", batch_dim, per_sample, shape, None)


def _shape(tensor: torch.Tensor) -> tuple[int, ...] | None:
    """The tensor's shape, or None where it has no fixed sizes: a nested tensor (raises at ``.shape``, or has a
    ragged size that is not an int)."""
    if not tensor.is_nested:
        return tuple(tensor.shape)
    try:
        shape = tuple(tensor.shape)
    except RuntimeError:
        return None
    return shape if all(type(size) is int for size in shape) else None


def _balanced_choice(categories: list[str], limit: int | None) -> SampleChoice:
    """Up to ``limit`` samples, taken round-robin over the categories, sorted by (category, index)."""
    by_category: dict[str, list[int]] = {}
    for index, category in enumerate(categories):
        by_category.setdefault(category, []).append(index)
    limit = len(categories) if limit is None else min(limit, len(categories))
    chosen: list[tuple[str, int]] = []
    queues = {c: list(v) for c, v in sorted(by_category.items())}
    while len(chosen) < limit:
        for category, indices in queues.items():
            if indices and len(chosen) < limit:
                chosen.append((category, indices.pop(0)))
    chosen.sort()
    return SampleChoice([i for _, i in chosen], [c for c, _ in chosen])

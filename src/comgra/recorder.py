"""ComgraRecorder: the Comgra-compatible recording API.

Thin by design: it checks the call order and the arguments, and delegates to ``capture`` (the torch side) and
``store`` (the files). On a step that is not recorded every call returns after a flag check.

    >>> import comgra
    >>> from comgra.recorder import ComgraRecorder
    >>> from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
    >>> comgra.my_recorder = ComgraRecorder("/tmp/comgra", "my_group", "trial_1",
    ...     DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10))  # doctest: +SKIP
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from comgra._version import __version__
from comgra.capture import compiled, gradients as scaling, kpis as kpi_buffer, open_recorders, stages, step_control
from comgra.capture.options import RecorderOptions
from comgra.capture.ranks import discover_rank
from comgra.capture.session import Session, report_fault
from comgra.capture.step import garbage_collector_paused
from comgra.capture.evidence import RunEvidence
from comgra.capture.modules import ModuleTracker, unwrapped as _unwrapped  # _unwrapped: for comgra.watch
from comgra.capture.watched import WatchedTensors
from comgra.profiling.instruments import Instruments
from comgra.profiling import profiler
from comgra.profiling.resources import FROM_CONFIG, resolve_interval
from comgra.config import load_settings
from comgra.errors import RecordingError
from comgra.breakpoints.recording import RecorderBreakpoints
from comgra.breakpoints.sentinels import Sentinels
from comgra.objects import DecisionMakerForRecordings
from comgra.store.hyperparameters import flatten as flat_hyperparameters, scalars_of  # noqa: F401 - callbacks

__all__ = ["ComgraRecorder"]

# Under torch.compile (see comgra.capture.compiled): whether TorchDynamo traces now, and a method run outside its graph.
_is_compiling = compiled.is_compiling
_untraced = compiled.untraced


def _never_traced(method: Callable[..., Any]) -> Callable[..., Any]:
    """A public method that leaves a traced frame (see _untraced) before it does anything: for the calls made once
    or rarely. The calls of every step check inline, where a wrapper's frame (0.25 us) would cost more than the
    check (0.03 us)."""
    @functools.wraps(method)
    def entry(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return _untraced(method)(self, *args, **kwargs)
        return method(self, *args, **kwargs)
    entry.untraced = method  # type: ignore[attr-defined]
    return entry


def _prepare_untraced() -> None:
    """The wrappers of every entry point, made while no trace runs (see compiled.prepare)."""
    compiled.prepare(lambda: [getattr(m, "untraced", m) for m in (getattr(ComgraRecorder, n) for n in _ENTRY_POINTS)])


class ComgraRecorder(WatchedTensors):
    """Records named tensors, their gradients and the tracked parameters on the steps a policy picks.

    The arguments are those of the original Comgra 0.11.5. ``max_num_mappings_to_save_at_once_during_serialization``
    and ``type_of_serialization`` have no effect (comgra writes Parquet). ``calculate_svd_and_other_expensive_...``
    is off by default (on in the original): spectral norms (``svd_max``), no detector reads them, cost half a small
    model's recorded step. ``max_num_neurons_to_record`` (ours) caps the values of each tensor kept per sample. Under
    torch.distributed every rank records its own shard of the trial; ``record_ranks`` (ours: ``"all"``, ``"zero"``
    or a list of ranks) limits that, and the other ranks behave as with ``comgra_is_active=False``.
    ``profile_history``, ``profile_flops_every`` and ``profile_every`` (ours) tune per-layer profiling
    (``track_module(..., profile=True)``); ``resource_seconds`` (ours) is the interval of resource sampling, None to
    switch it off; left out, comgra.toml's ``[profiling] resource_interval_s`` (1.0 without a file; 0: off).
    Where an argument is left out, comgra.toml (``config``) decides."""

    def __init__(
        self, comgra_root_path: str | Path, group: str, trial_id: str,
        decision_maker_for_recordings: DecisionMakerForRecordings,
        max_num_batch_size_to_record: int | None = None,
        prefixes_for_grouping_module_parameters_visually: list[str] | None = None,
        prefixes_for_grouping_module_parameters_in_nodes: list[str] | None = None,
        comgra_is_active: bool = True,
        max_num_mappings_to_save_at_once_during_serialization: int = 10000,
        type_of_serialization: str = "msgpack",
        calculate_svd_and_other_expensive_operations_of_parameters: bool = False,
        *,
        max_num_neurons_to_record: int = 256,
        flush_seconds: float = 2.0,
        record_ranks: str | Iterable[int] = "all",
        profile_history: int | None = None,
        profile_flops_every: int | None = None,
        profile_every: int = 1,
        resource_seconds: float | None = FROM_CONFIG,
        breakpoints: Iterable[dict[str, Any]] | None = None,
        config: str | Path | None = None,
    ):
        # comgra.toml (``config=`` or the working directory); see comgra.config. Read first: a bad key fails early.
        self.settings = load_settings(config)
        self.options = RecorderOptions.create(
            root=comgra_root_path, group=group, trial_id=trial_id, policy=decision_maker_for_recordings,
            max_samples=max_num_batch_size_to_record,
            visual_prefixes=prefixes_for_grouping_module_parameters_visually,
            node_prefixes=prefixes_for_grouping_module_parameters_in_nodes,
            active=comgra_is_active, with_svd=calculate_svd_and_other_expensive_operations_of_parameters,
            max_neurons=max_num_neurons_to_record, flush_seconds=flush_seconds, record_ranks=record_ranks,
            settings=self.settings,
        )
        # Checked before any folder is made: a bad value leaves nothing behind.
        profile_options = profiler.profile_options(self.settings, profile_history, profile_flops_every, profile_every)
        resource_seconds = resolve_interval(resource_seconds, self.settings.profiling.resource_interval_s)
        self.rank_info = discover_rank()
        # A rank that does not record is a recorder switched off: no folder, no cost.
        comgra_is_active = comgra_is_active and self.options.records_rank(self.rank_info.rank)
        self.comgra_is_active = comgra_is_active
        self.decision_maker_for_recordings = decision_maker_for_recordings
        self.modules = ModuleTracker()
        self.current_stage = "inactive"
        self.training_step: int | None = None
        self.type_of_execution: str | None = None
        self._quiet = False  # the step takes nothing but the sentinels' (start_batch decides; see register_tensor)
        self._recording = False
        self._dynamic = False
        self._takes_tensors = False  # this step takes tensors (recorded, or watched by a breakpoint): it runs eagerly
        self._eager = compiled.EagerSteps()  # torch.compile's stance on such steps: see comgra.capture.compiled
        self._all_types_declared = False
        self._types_seen: set[str] = set()
        self._kpis = kpi_buffer.KpiBuffer()
        self._batch_size = 0
        self._iteration_serial = 0  # start_iteration calls: comgra.watch counts a module's calls per iteration
        self._on_finalize: list[Any] = []  # callables, e.g. removing comgra.watch's hooks
        self._step_listeners: list[Any] = []  # told at start_batch whether the step takes tensors, at finish_batch
        self.session: Session | None = None
        if comgra_is_active:  # an earlier recorder of this trial (a notebook cell run again) is finished first
            open_recorders.finish_earlier(self.options, self.rank_info.rank, self.rank_info.world_size)
            self.session = Session.open(self.options, __version__, self.rank_info)
            open_recorders.hold(self, self.session.directory, self.rank_info.rank)
        # Breakpoints and run control (comgra.breakpoints); None when comgra is off, so that costs nothing.
        self._breakpoints = RecorderBreakpoints.attach(self, breakpoints=breakpoints, settings=self.settings) \
            if comgra_is_active else None
        # The run's state on recorded steps, sentinels on every step (capture.evidence, breakpoints.sentinels).
        self._evidence = RunEvidence.attach(self, Sentinels.attach(self))
        self._unwatched = self._evidence.sentinels.unwatched  # the same set, kept by the sentinels
        # Per-layer profiling (track_module(..., profile=True)) and resource sampling; see profiling/instruments.
        self.instruments = Instruments(
            self.session, profile=profile_options, resource_seconds=resource_seconds, rank=self.rank_info.rank,
            resource_samples=self.settings.history.resource_samples)

    @property
    def _recording(self) -> bool:
        """True while this step is recorded. A fault of comgra's own, found at any call, ends it at once."""
        return self._recording_step and self.session is not None and not self.session.broken

    @_recording.setter
    def _recording(self, value: bool) -> None:
        self._recording_step = value
        if value:
            self._quiet = False

    # -- setup ---------------------------------------------------------------------------------
    @_never_traced
    def track_module(self, module_name: str, module: torch.nn.Module, profile: bool | None = None) -> None:
        """Track the parameters of ``module`` and its submodules under ``module_name``. ``profile=True`` (ours) also
        measures every submodule on every training step (time, memory, FLOPs on the steps asked for, output statistics
        and gradient norms on recorded steps) into the ``layers`` table. None: comgra.toml's ``[profiling] enabled``."""
        if self.current_stage != "inactive":
            raise RecordingError(f"track_module({module_name!r}, ...) was called inside training step "
                                 f"{self.training_step}; track modules before the first start_batch().")
        self.modules.track(module_name, module)
        if self.session is not None:
            self.session.set_modules(self.modules)
        if profile if profile is not None else self.settings.profiling.enabled:
            self.instruments.profile(module_name, module)
        if self._breakpoints is not None:
            self._breakpoints.monitor.add_modules(module_name, module)

    @_never_traced
    def track_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Ours: record ``optimizer``'s parameter groups (which parameters, lr, weight decay) on recorded steps, so
        that ``comgra scan`` finds parameters left out of every group. The Trainer and Lightning callbacks call it."""
        self._evidence.track_optimizer(optimizer)

    @_never_traced
    def set_sentinels(self, names: Iterable[str] | None = None, *, enabled: bool = True,
                      pause_on_error: bool = False) -> None:
        """Ours: the tensors whose NaN/Inf flags, abs_max and norm are kept on every step (None: the losses and outputs);
        ``pause_on_error``: a NaN, an inf or an empty batch pauses like a breakpoint. See breakpoints.sentinels."""
        self._evidence.sentinels.configure(names, enabled=enabled, pause_on_error=pause_on_error)

    def get_name_of_module(self, module: torch.nn.Module) -> str:
        return self.modules.name_of(module)

    @_never_traced
    def add_note(self, note: Any) -> None:
        """Log a line for the Notes tab, whether or not the step is recorded."""
        if self.session is not None:
            self.session.add_note(str(note))

    @_never_traced
    def record_hyperparameters(self, mapping: Mapping[str, Any]) -> None:
        """The trial's hyperparameters for the Runs view (``{"lr": 0.1, "model": {"width": 64}}``; numbers, strings,
        booleans, None; nested mappings flattened with dots). Ours; call it again to add, later values win."""
        values = flat_hyperparameters(mapping)  # checked on every rank, also with comgra off: a mistake shows early
        if self.session is not None:
            self.session.record_hyperparameters(values)

    def recording_is_active(self) -> bool:
        return self._recording

    def declare_that_all_different_types_of_execution_have_been_encountered(self) -> None:
        self._all_types_declared = True

    # -- training steps ---------------------------------------------------------------------------
    def start_batch(self, training_step: int, current_batch_size: int,
                    type_of_execution: str | None = "main_execution_type",
                    record_all_tensors_per_batch_index_by_default: bool = True,
                    override__recording_is_active: bool | None = None) -> None:
        if not self.comgra_is_active:
            return
        if _is_compiling():  # see _untraced; inline here and below: a wrapper's frame cost more than the check
            return _untraced(ComgraRecorder.start_batch)(self, training_step, current_batch_size, type_of_execution,
                                                         record_all_tensors_per_batch_index_by_default,
                                                         override__recording_is_active)
        if not compiled.prepared:
            _prepare_untraced()
        if self.current_stage != "inactive":
            raise RecordingError(f"start_batch({training_step}) was called while training step {self.training_step} "
                                 "is still open; call finish_batch() at the end of each training step, or "
                                 "abandon_step() to drop a step that an exception interrupted.")
        step_control.opened(self, training_step, type_of_execution)  # checked; what abandon_step() goes back to
        self.training_step, self.type_of_execution = training_step, type_of_execution
        self._batch_size = current_batch_size
        self.current_stage = "started"
        self._dynamic = type_of_execution is None
        recording = step_control.decide(self, training_step, type_of_execution, override__recording_is_active)
        if recording and self.session is not None:
            recording = self.session.start_step(
                training_step, current_batch_size, type_of_execution, self.modules,
                record_all_tensors_per_batch_index_by_default)
        if self._breakpoints is not None:
            recording = self._breakpoints.start_batch(recording, training_step, current_batch_size,
                                                      record_all_tensors_per_batch_index_by_default)
        self._recording_step = recording = bool(recording) and self.session is not None and not self.session.broken
        self._takes_tensors = wanted = recording or (self._breakpoints is not None and self._breakpoints.monitor.active)
        self._quiet = not wanted  # nothing of this step is taken but the sentinels' (see register_tensor)
        self.instruments.start_step(training_step, recording)
        self._evidence.start_batch(training_step, type_of_execution, current_batch_size, recording)
        if wanted or self.instruments.profiler is not None and self.instruments.wants_eager_step:  # compiled models (see
            self._eager.enter()  # comgra.capture.compiled); a FLOPs step too (Profiler.counts_flops)
        for listener in list(self._step_listeners) if self._step_listeners else ():  # comgra.watch
            listener(wanted)

    def start_iteration(self) -> None:
        if not self.comgra_is_active:
            return
        if _is_compiling():
            return _untraced(ComgraRecorder.start_iteration)(self)
        self._check_stage("start_iteration")
        self.current_stage = "forward"
        self._iteration_serial += 1
        if self._breakpoints is not None and not self._quiet:  # quiet: no breakpoint watches this step (no call)
            self._breakpoints.start_iteration()
        if self._recording_step and self._recording:
            self._guarded(lambda session: session.step.start_iteration())

    def register_tensor(self, tensor_name: str, tensor: torch.Tensor, index_of_batch_dimension: int | None = 0,
                        is_input: bool = False, is_parameter: bool = False, is_target: bool = False,
                        is_loss: bool = False, recording_type: str | None = None,
                        record_per_batch_index: bool | None = None, node_name: str | None = None,
                        role_within_node: str | None = None, is_initial_value: bool = False) -> None:
        """Name a tensor of the current iteration (or, with ``is_initial_value``, of none yet)."""
        if not self.comgra_is_active:
            return
        if _is_compiling():  # in a compiled forward on a step that takes no tensors: traces to nothing
            if not self._takes_tensors:
                return
            return _untraced(ComgraRecorder.register_tensor)(  # type: ignore[no-any-return]
                self, tensor_name, tensor, index_of_batch_dimension, is_input, is_parameter, is_target, is_loss,
                recording_type, record_per_batch_index, node_name, role_within_node, is_initial_value)
        if self._quiet and tensor_name in self._unwatched and self.current_stage == "forward" and not (
                is_input or is_target or is_loss or is_initial_value):
            return  # a step that takes nothing, a name the sentinels do not watch (Sentinels.wants said so before)
        watched = self._breakpoints is not None and self._breakpoints.monitor.active
        if not (watched or self._recording_step or is_initial_value) and self.current_stage == "forward":
            return self._evidence.register(tensor_name, tensor, is_loss, False, is_input or is_target)  # the sentinels
        if not stages.registration_goes_on(self, tensor_name, tensor, is_initial_value, watched, is_loss,
                                           is_input or is_target):  # or checkpointing's
            return
        arguments: dict[str, Any] = dict(index_of_batch_dimension=index_of_batch_dimension,
                                         flags=dict(is_input=is_input, is_parameter=is_parameter, is_target=is_target,
                                                    is_loss=is_loss, is_initial_value=is_initial_value),
                                         recording_type=recording_type, record_per_batch_index=record_per_batch_index,
                                         node_name=node_name, role_within_node=role_within_node)
        if watched:  # may start recording this step (a breakpoint held)
            self._breakpoints.register(tensor_name, tensor, arguments)  # type: ignore[union-attr]
        if self._recording:
            self.session.register(tensor_name, tensor, **arguments)  # type: ignore[union-attr]

    def add_tensor_connection(self, src: torch.Tensor | str, sink: torch.Tensor | str) -> None:
        """Draw an edge the autograd graph does not show (after detach(), or through integer tensors)."""
        if self.comgra_is_active and _is_compiling():
            return _untraced(ComgraRecorder.add_tensor_connection)(  # type: ignore[return-value]
                self, src, sink) if self._takes_tensors else None
        if self._breakpoints is not None:
            self._breakpoints.keep(("connect", src, sink))
        if self._recording:
            self.session.step.connect(src, sink)  # type: ignore[union-attr]

    def detach_while_keeping_connection(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor.detach()``, still connected to ``tensor`` in the dependency graph."""
        if self.comgra_is_active and _is_compiling():
            return _untraced(ComgraRecorder.detach_while_keeping_connection)(self, tensor) \
                if self._takes_tensors else tensor.detach()  # type: ignore[no-any-return]
        result = tensor.detach()
        if self._recording:
            if result.is_floating_point():
                result.requires_grad_(True)
            self.session.step.connect(tensor, result)  # type: ignore[union-attr]
        return result

    def record_current_gradients(self, name_of_loss_group: str, set_gradients_to_zero_if_not_a_parameter: bool = False,
                                 *, scaler: Any = None, loss_scale: float | None = None) -> None:
        """Snapshot the gradients of every registered tensor and parameter as ``name_of_loss_group`` (again: the last
        call's are kept), unscaled by ``scaler=`` (a GradScaler) or ``loss_scale=`` (ours; capture/gradients.py)."""
        if self.comgra_is_active and _is_compiling():
            return _untraced(ComgraRecorder.record_current_gradients)(
                self, name_of_loss_group, set_gradients_to_zero_if_not_a_parameter, scaler=scaler, loss_scale=loss_scale)
        watched = self._breakpoints is not None and self._breakpoints.monitor.active
        if not (watched or self._recording_step and self._recording):
            return
        scale = scaling.scale_of(scaler, loss_scale)  # a host read of the scale: on recorded (or watched) steps only
        if watched:  # may start recording this step (a gradient condition held)
            self._breakpoints.gradients(name_of_loss_group, set_gradients_to_zero_if_not_a_parameter, scale)  # type: ignore[union-attr]
        if self._recording:
            stages.check_gradient_group(name_of_loss_group)
            self._evidence.gradients(scale.parameters)  # fingerprints, before an optimizer's zero_grad clears them
            self._guarded(lambda session: session.step.record_gradients(
                name_of_loss_group, set_gradients_to_zero_if_not_a_parameter, scale))

    def finish_iteration(self) -> None:
        if not self.comgra_is_active:
            return
        if _is_compiling():
            return _untraced(ComgraRecorder.finish_iteration)(self)
        self._check_stage("finish_iteration")
        self.current_stage = "after_iteration"
        if self._breakpoints is not None and not self._quiet:  # quiet: no replay of this step is kept (no call)
            self._breakpoints.keep(("finish_iteration",))
        if self._recording_step and self._recording:
            self._guarded(lambda session: session.finish_iteration())

    def decide_recording_of_batch(self, type_of_execution: str | None, category_per_sample: list[Any]) -> None:
        """For dynamic recordings (``start_batch(..., type_of_execution=None)``): decide at the end."""
        if not self.comgra_is_active:
            return
        if _is_compiling():
            return _untraced(ComgraRecorder.decide_recording_of_batch)(self, type_of_execution, category_per_sample)
        self._check_stage("decide_recording_of_batch")
        stages.check_decision(type_of_execution, self.type_of_execution, dynamic=self._dynamic,
                              all_declared=self._all_types_declared, seen=self._types_seen)
        if not self._dynamic:
            return
        self._dynamic = False
        if type_of_execution is not None:
            self._types_seen.add(type_of_execution)
        self.type_of_execution = type_of_execution
        self._kpis.set_type(type_of_execution)
        wanted = type_of_execution is not None and self.decision_maker_for_recordings.is_record_on_this_step(
            self.training_step, type_of_execution)  # type: ignore[arg-type]
        wanted = wanted or (self._breakpoints is not None and self._breakpoints.forced)
        if self._recording:
            self._recording = self.session.decide(wanted, type_of_execution, list(category_per_sample))  # type: ignore[union-attr]

    def finish_batch(self) -> None:
        if not self.comgra_is_active:
            return
        if _is_compiling():
            return _untraced(ComgraRecorder.finish_batch)(self)
        self._check_stage("finish_batch")
        if self._dynamic:
            raise RecordingError(f"Training step {self.training_step} started with type_of_execution=None; call "
                                 "decide_recording_of_batch(type_of_execution, category_per_sample) before finish_batch().")
        quiet, self.current_stage, self._quiet = self._quiet, "inactive", False
        settles = self._breakpoints is not None
        try:
            for listener in list(self._step_listeners) if self._step_listeners else ():
                listener(False)
            recording = self._recording_step and self._recording
            self._evidence.finish_batch(recording, self.type_of_execution, pausable=settles)
            # A quiet step (neither recorded nor watched by a breakpoint since start_batch) has nothing to settle, let
            # go of or pause for, unless a sentinel's error asked for a pause (its hit): then no call.
            settles = settles and not (quiet and self._breakpoints.monitor.step.hit is None)  # type: ignore[union-attr]
            if settles:  # the ranks agree on a hit; a rank that did not record replays the step
                self._breakpoints.settle()  # type: ignore[union-attr]
                recording = self._recording  # a breakpoint's hit may have started recording this step
            if recording:
                self._guarded(lambda session: session.finish_step(self.decision_maker_for_recordings))
            self._recording_step = False
            if self.session is not None and self._kpis.rows:
                self.session.flush_kpis(self._kpis, force=False)
            self.instruments.finish_step(type_of_execution=self.type_of_execution)
        finally:
            self._end_eager_step()
        if settles:  # pauses here when a breakpoint held; raises TrainingAborted on abort
            self._breakpoints.finish_batch()  # type: ignore[union-attr]

    @_never_traced
    def finalize(self) -> None:
        """Write everything still buffered. Safe to call more than once."""
        self._end_eager_step()
        on_finalize, self._on_finalize = self._on_finalize, []
        for action in on_finalize:  # comgra.watch's hooks go first: nothing may register into a closed trial
            action()
        if self.session is not None:
            self.session.flush_kpis(self._kpis, force=True)
            self.instruments.close()
            self.session.close(sorted(self._types_seen))
        if self._breakpoints is not None:
            self._breakpoints.close()
        open_recorders.release(self)

    @_never_traced
    def abandon_step(self) -> bool:
        """Drop the training step in progress, one an exception interrupted: nothing of it is stored, and
        ``start_batch`` works again, also with the same ``training_step``. False where no step was open. Ours;
        ``batch()`` calls it for you. See the README's "Notebooks"."""
        return step_control.abandon(self)

    def batch(self, training_step: int, current_batch_size: int, type_of_execution: str | None = "main_execution_type",
              record_all_tensors_per_batch_index_by_default: bool = True,
              override__recording_is_active: bool | None = None) -> AbstractContextManager[ComgraRecorder]:
        """``with recorder.batch(step, len(x)):`` start_batch, then finish_batch, or abandon_step if it raises."""
        return step_control.batch(self, (training_step, current_batch_size, type_of_execution,
                                         record_all_tensors_per_batch_index_by_default, override__recording_is_active))

    @_never_traced
    def flush(self, timeout: float | None = 60.0) -> None:
        """Write the steps, KPI points and notes given so far, and wait (at most ``timeout`` seconds) until a reader
        sees them. Ours. The writer writes on its own every ``flush_seconds`` (growing with the run's age, to 30 s);
        call this where a reader must see the run up to now (before ``comgra scan`` of a run in progress, beside a
        checkpoint), not on every step: each call writes one small chunk per table (merged later).

            >>> comgra.my_recorder.flush()  # doctest: +SKIP
        """
        if self.session is None:
            return
        if not self._dynamic:  # a step whose type is not decided yet keeps its KPI points until it is
            self.session.flush_kpis(self._kpis, force=True)
        self.session.flush(timeout)

    # -- KPIs -----------------------------------------------------------------------------------
    def record_kpi_in_graph(self, kpi_group: str, kpi_name: str, val: Any, timepoint: int | None = None,
                            record_even_if_recording_is_inactive: bool = False) -> None:
        """A scalar for the Graphs tab. Tensors are moved to the host in batches, not one by one."""
        if self.comgra_is_active and _is_compiling():
            if not (self._takes_tensors or record_even_if_recording_is_inactive):
                return None  # traced to nothing
            return _untraced(ComgraRecorder.record_kpi_in_graph)(self, kpi_group, kpi_name, val, timepoint,
                                                                 record_even_if_recording_is_inactive)
        if self.session is None or not (self._recording or record_even_if_recording_is_inactive):
            return
        point = self.training_step if timepoint is None else timepoint
        if point is None:
            raise RecordingError(f"record_kpi_in_graph({kpi_group!r}, {kpi_name!r}, ...) outside a training step "
                                 "needs timepoint=...")
        self._kpis.add(kpi_group, kpi_name, self.type_of_execution, point, val)

    # -- internals ------------------------------------------------------------------------------
    def _check_stage(self, call: str) -> None:  # the stage read here: one call, not two, on every step
        if self.current_stage not in stages.STAGES_FOR[call]:
            stages.check_stage(call, self.current_stage)

    def _guarded(self, action: Any) -> None:
        """Run a recording action; a fault of comgra's own stops recording, never the training."""
        try:
            with garbage_collector_paused():  # see there: a collection here examined objects about to be freed
                action(self.session)
        except (RecordingError, Warning):  # the user's mistake, or a warning the user made an error
            raise
        except Exception as error:  # noqa: BLE001
            report_fault(self.session, error)  # type: ignore[arg-type]
            self._recording = False
            if self._breakpoints is None or not self._breakpoints.monitor.active:
                self._end_eager_step()  # nothing more to take: compiled code runs compiled again

    def _end_eager_step(self) -> None:
        """The step takes no more tensors: the compiler's stance of before it (see comgra.capture.compiled)."""
        self._takes_tensors = False
        self._eager.leave()


# The entry points that leave a traced frame: the rare ones through _never_traced, the others inline.
_ENTRY_POINTS = tuple(name for name, value in vars(ComgraRecorder).items() if hasattr(value, "untraced")) + (
    "start_batch", "start_iteration", "register_tensor", "add_tensor_connection", "detach_while_keeping_connection",
    "record_current_gradients", "finish_iteration", "decide_recording_of_batch", "finish_batch", "record_kpi_in_graph")

"""One recorded training step: registrations, graphs per iteration, gradients.

Everything here lives only between ``start_batch`` and ``finish_batch``;
``close`` removes the gradient hooks and drops every tensor reference, so the
recorder keeps nothing alive after a step.
"""
from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa
import torch

from comgra.capture import background
from comgra.capture import gradients as scaling
from comgra.capture import graph as graphs
from comgra.capture import sharded, shards
from comgra.capture.checkpointing import Checkpoints, Region
from comgra.capture.iteration_graph import IterationGraphs
from comgra.capture.registry import Registration
from comgra.capture.summaries import (Block, SampleChoice, complex_notice, summarize_values, to_table,
                                      unsummarisable)
from comgra.errors import RecordingError, did_you_mean
from comgra.store import format as fmt

# A tensor with at least this many elements is summarised on its device the moment it is registered;
# a smaller one is copied (``detach().clone()``) and summarised with the other copies at the end of
# the step. Either way an in-place op after registration (``ReLU(inplace=True)``, ``out += identity``)
# cannot change what is recorded. Below the threshold, the per-tensor kernel launches of a summary
# would cost more than the copy, and one batched segment pass over many small copies is what keeps
# activations fast; above it, the summary is bandwidth-bound anyway, so summarising alone costs about
# what batching would, and copying would double the tensor's memory (the copy of a tensor just below
# the threshold is 256 KiB in float32). The summary's kernels are queued at once: no host sync.
SUMMARIZE_AT_REGISTRATION_FROM = 65_536

# A recorded step's rows are built on the writer's thread (``StepRecording.to_tables(later=...)``) where its copies
# to summarise take at most this many bytes; the writer holds at most store.writer.LATER_BYTES of such steps.
LATER_UP_TO_BYTES = 4 << 20


class LaterRows(NamedTuple):
    """A recorded step's rows, to be built by ``build()`` on the writer's thread, holding ``size`` bytes meanwhile."""

    build: Callable[[], tuple[pa.Table, pa.Table]]
    size: int


def later_size(pending: list[tuple[Registration, torch.Tensor]], blocks: list[Block], with_svd: bool) -> int | None:
    """The bytes a step's last statistics and rows hold while they wait for another thread, or None where they may
    not wait: every value must be on the CPU, each one ``pending`` a copy that only comgra holds (not a live tensor
    of the user's), with no spectral norm among them (its power iteration starts from the last step's vector)."""
    size = 0
    for registration, value in pending:
        if (value is registration.tensor or not value.is_cpu or registration.recording_type == "kpis_and_svd"
                or (with_svd and registration.tensor_type == "parameter")):
            return None
        size += value.nbytes
    for block in blocks:
        if not block.summary.per_sample.is_cpu:
            return None
        size += block.summary.per_sample.nbytes + block.summary.neurons.nbytes
    return size if size <= LATER_UP_TO_BYTES else None


@contextlib.contextmanager
def garbage_collector_paused() -> Iterator[None]:
    """No garbage collection while the recorder's own work runs (the graph walk, the summaries, the rows).

    That work makes about a thousand short-lived Python objects (autograd node wrappers, the walk's
    sets, lists and tuples), nearly all freed before it returns. A collection in the middle examined them
    all for nothing, on almost every recorded step, and moved what the step still held into the older
    generations, so that a full collection of the whole process (about 150 ms for the 340K objects of a
    ResNet-18 training process) came every 150 recorded steps; without comgra these workloads never
    start one. Paused, the objects freed before the end never count: measured on ResNet-18 over 150
    recorded steps, 42 collections of the youngest generation instead of 137, 4 of the middle one instead
    of 12, and no full one instead of one (177 ms). Garbage with reference cycles made meanwhile is
    collected at the next collection after the call, as always.
    Where the user paused the collector, it stays paused."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass
class StepOptions:
    max_neurons: int
    with_svd: bool
    max_samples: int | None


@dataclass
class StepRecording(IterationGraphs):
    training_step: int
    batch_size: int
    type_of_execution: str | None
    options: StepOptions
    iteration: int = -1
    registrations: dict[tuple[int, str], Registration] = field(default_factory=dict)
    latest_by_name: dict[str, tuple[int, str]] = field(default_factory=dict)
    connections: graphs.Connections = field(default_factory=graphs.Connections)
    graph_documents: list[dict[str, Any]] = field(default_factory=list)
    blocks: list[Block | background.Job] = field(default_factory=list)  # a Job: blocks still being computed
    kinds: list[str] = field(default_factory=lambda: [fmt.FORWARD])
    choice: SampleChoice | None = None
    keep_alive: list[torch.Tensor] = field(default_factory=list)
    switched_on_grad: list[torch.Tensor] = field(default_factory=list)  # leaves we set requires_grad on
    _grads: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    _hooks: list[Any] = field(default_factory=list)
    # Values to summarise together later: copies made at registration, and the live parameters
    # (summarised at the first start_iteration, before an optimizer step can change them).
    _pending_forward: list[tuple[Registration, torch.Tensor]] = field(default_factory=list)
    _by_tensor_id: dict[int, tuple[int, str]] = field(default_factory=dict)  # registered tensors stay alive
    _by_node_role: dict[tuple[str, str], list[Registration]] = field(default_factory=dict)
    parameter_aliases: dict[str, list[str]] = field(default_factory=dict)  # tied parameters: first name -> others
    _parameter_job: background.Job | None = None  # the parameters' statistics, on the worker (CPU only)
    checkpoints: Checkpoints = field(default_factory=Checkpoints)  # torch.utils.checkpoint (capture/checkpointing.py)
    # report(key, message): a warning once per key (Session.warn_once); None: nobody to tell (tests)
    report: Callable[[str, str], None] | None = None
    dtensors: sharded.StepShards | None = None  # this rank's parts of DTensors (capture/sharded.py); None: left out

    # -- registration -----------------------------------------------------------------------
    def register(self, registration: Registration, tensor: torch.Tensor, *, live: bool = False,
                 takeover: bool = False, region: Region | None = None) -> None:
        """Remember ``tensor`` under ``registration``; ``live``: summarise the tensor itself at the first
        start_iteration (tracked parameters) instead of its value now. A tensor registered again under a
        second name depends on the earlier name only; ``takeover``: the second name is then the one that
        the tensor's consumers depend on (a block that returns its last layer's output: layer -> block ->
        next block), else the first name stays that (the user's own registrations, as always). ``region``: made without
        a gradient in a reentrant checkpoint, the registration waits for the recomputation (capture/checkpointing.py)."""
        key = registration.key
        if key in self.registrations:
            raise RecordingError(
                f"Tensor {registration.tensor_name!r} is registered twice in iteration {registration.iteration} "
                f"of training step {self.training_step}. Give each tensor of an iteration its own name, or use "
                "node_name=... with a distinct role_within_node=... to group several tensors in one node.")
        same_place = self._by_node_role.setdefault((registration.node, registration.role), [])
        for other in same_place:  # a dict, not a scan of every registration: ResNet-18 has 90 per step
            if other.iteration == registration.iteration:
                raise RecordingError(
                    f"Node {registration.node!r} already has a tensor with role {registration.role!r} in iteration "
                    f"{registration.iteration} ({other.tensor_name!r}); pass a distinct role_within_node=...")
            if -1 in (other.iteration, registration.iteration):
                # An initial value is drawn in the graph of every iteration that uses it, under its own node name.
                raise RecordingError(
                    f"Node {registration.node!r} with role {registration.role!r} is used both before the first "
                    f"iteration and in iteration {max(other.iteration, registration.iteration)} "
                    f"({other.tensor_name!r}, {registration.tensor_name!r}); the graph could not tell them apart. "
                    f"Give the initial value a name of its own, e.g. 'initial_{registration.tensor_name}'.")
        self.registrations[key] = registration
        same_place.append(registration)
        self.latest_by_name[registration.tensor_name] = key
        self._by_tensor_id.setdefault(id(tensor), key)
        registration.grad_fn = tensor.grad_fn
        reason = self._readable(fmt.FORWARD, registration, value := shards.waited(tensor))  # a TP layer's local output
        if reason is None:
            if tensor.is_complex():
                self._tell_complex(registration, tensor)
            self._capture_value(registration, value, live)
        else:  # still a node of the graph, with no rows
            self._skip(registration, "values", reason)
        if tensor.grad_fn is not None:
            owner = self.connections.by_grad_fn.get(tensor.grad_fn)
            if owner is None and self.checkpoints.regions:  # the output of a reentrant checkpoint, registered inside
                owner = self.checkpoints.registered_inside(tensor)
            if owner is None or takeover:
                self.connections.by_grad_fn[tensor.grad_fn] = key
            registration.same_as = owner  # type: ignore[assignment]  # a registration key: (iteration, name)
        else:
            self.connections.by_leaf.setdefault(id(tensor), key)
        if region is not None:
            self.checkpoints.wait(region, registration, tensor)
        if tensor.requires_grad and registration.tensor_type != "parameter":
            self._hooks.append(tensor.register_hook(self._gradient_hook(key)))

    def register_parameters(self, registrations: list[Registration]) -> None:
        """``register(r, r.tensor, live=True)`` for the tracked parameters at the start of a step, without
        the checks that cannot fail there: nothing is registered yet, and each parameter has a name (and so
        a role) of its own. A step of ResNet-18 registers 62 of them."""
        assert not self.registrations, "the parameters come first"
        for registration in registrations:
            key, tensor = registration.key, registration.tensor
            self.registrations[key] = registration
            self._by_node_role[(registration.node, registration.role)] = [registration]
            self.latest_by_name[registration.tensor_name] = key
            self._by_tensor_id.setdefault(id(tensor), key)
            reason = self._readable(fmt.FORWARD, registration, tensor)
            if reason is None:
                if tensor.is_complex():  # type: ignore[union-attr]
                    self._tell_complex(registration, tensor)  # type: ignore[arg-type]
                self._pending_forward.append((registration, tensor))  # type: ignore[arg-type]
            else:  # an FSDP2 parameter (a DTensor), whose .grad is one too: a node of the graph with no rows
                self._skip(registration, "values and gradients", reason)
            registration.grad_fn = tensor.grad_fn  # type: ignore[union-attr]
            if registration.grad_fn is not None:  # a non-leaf "parameter" (a tensor the user tracked so)
                self.connections.by_grad_fn.setdefault(registration.grad_fn, key)
            else:
                self.connections.by_leaf.setdefault(id(tensor), key)

    def _capture_value(self, registration: Registration, tensor: torch.Tensor, live: bool) -> None:
        """Fix the recorded value now, so that later in-place ops cannot change it."""
        if live:
            self._pending_forward.append((registration, tensor))
        elif tensor.numel() >= SUMMARIZE_AT_REGISTRATION_FROM:
            self.blocks += summarize_values(fmt.FORWARD, [(registration, tensor.detach())],
                                            max_neurons=self.options.max_neurons, with_svd=self.options.with_svd)
        else:
            self._pending_forward.append((registration, tensor.detach().clone()))

    def _tell_complex(self, registration: Registration, tensor: torch.Tensor) -> None:
        if self.report is not None:
            self.report(f"complex:{registration.tensor_name}", complex_notice(registration.tensor_name, tensor.dtype))

    def _skip(self, registration: Registration, what: str, reason: str) -> None:
        """Leave out a value comgra cannot summarise, and say so once per tensor name: never a crash in the
        kernel, never a stop of the recording, never a wrong number recorded in silence."""
        if self.report is not None and reason:  # "": not left out (a DTensor's shard, taken by capture/sharded.py)
            self.report(f"unsummarisable:{registration.tensor_name}",
                        f"comgra cannot summarise the {what} of tensor {registration.tensor_name!r} {reason}; they "
                        "are left out of the recording (no rows), the rest of the step is recorded and training "
                        "goes on. This warning is given once per tensor name.")

    def _readable(self, kind: str, registration: Registration, tensor: Any) -> str | None:
        """``unsummarisable(tensor)``, but "" for a DTensor whose shard this rank took (capture/sharded.py)."""
        reason = unsummarisable(tensor)
        if reason is not None and self.dtensors is not None and shards.is_dtensor(tensor):
            return self.dtensors.add(kind, registration, tensor)
        return reason

    def add_gradient(self, tensor_name: str, grad: torch.Tensor) -> None:
        """Give the latest tensor registered as ``tensor_name`` a gradient that arrived outside its hook.

        A replayed step (a breakpoint decided to record after the backward pass ran) kept the gradient
        itself; it is counted exactly as the hook would have counted it."""
        self._gradient_hook(self.latest_by_name[tensor_name])(grad)

    def _gradient_hook(self, key: tuple[int, str]) -> Any:
        def hook(grad: torch.Tensor | None) -> None:
            if self._parameter_job is not None:  # the first hook of the backward pass
                background.wait_at_end_of_backward(self._parameter_job)
                self._parameter_job = None
            if grad is None:  # an output the loss does not use, of a node with several (DDP's find_unused_parameters)
                return
            previous = self._grads.get(key)
            self._grads[key] = grad.detach() if previous is None else previous + grad.detach()
        return hook

    def resolve(self, item: Any, argument: str) -> Any:
        """A registered name or a tensor, as a registration key or the tensor itself."""
        if isinstance(item, str):
            if item not in self.latest_by_name:
                raise RecordingError(f"{argument}={item!r} is not a registered tensor name in training step "
                                     f"{self.training_step}" + did_you_mean(item, self.latest_by_name))
            return self.latest_by_name[item]
        if not isinstance(item, torch.Tensor):
            raise RecordingError(f"{argument} must be a tensor or a registered tensor name, got {type(item).__name__}.")
        key = self.connections.by_grad_fn.get(item.grad_fn) if item.grad_fn is not None else \
            self.connections.by_leaf.get(id(item))
        if key is None:  # a registered tensor changed in place since: its grad_fn is a new one
            key = self._by_tensor_id.get(id(item))
        return key if key is not None else item

    def connect(self, source: Any, sink: Any) -> None:
        source_key = self.resolve(source, "src")
        sink_item = self.resolve(sink, "sink")
        if isinstance(sink_item, torch.Tensor):
            self.keep_alive.append(sink_item)
            self.connections.add_manual(source_key, sink_item)
        else:
            self.connections.add_manual(source_key, self._tensor_of(sink_item), self.registrations[sink_item].grad_fn)
        if isinstance(source_key, torch.Tensor):
            self.keep_alive.append(source_key)

    def _tensor_of(self, key: tuple[int, str]) -> torch.Tensor:
        tensor = self.registrations[key].tensor
        if tensor is None:
            raise RecordingError(f"Tensor {key[1]!r} of iteration {key[0]} was already summarised; add connections "
                                 "to it before finish_iteration() of its iteration.")
        return tensor

    # -- iteration and batch ends -------------------------------------------------------------
    def start_iteration(self) -> None:
        """Before the first forward pass, summarise the parameters and initial values: an optimizer
        step later in the iteration would change the parameters in place."""
        if self.iteration < 0:
            self._summarize_pending(in_background=True)
        self.iteration += 1

    def finish_iteration(self, groups_of_parameters: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
        """Walk the autograd graph of this iteration. The copies of its small forward values are
        summarised at the end of the step, all iterations in one batched pass (a handful of kernels
        instead of a handful per iteration); large ones were summarised at registration."""
        document, unconnected = self._graph_of_iteration(groups_of_parameters)
        self.graph_documents.append(document)
        return document, unconnected

    def _summarize_pending(self, in_background: bool = False) -> None:
        """``in_background``: on the worker thread (CPU tensors; see capture/background.py), waited for
        before an optimizer step or a manual update can change the parameters."""
        items, self._pending_forward = self._pending_forward, []
        if not items:
            return
        if in_background and background.worth_a_thread([t for _, t in items]):
            job = background.Job(self._summarizer(fmt.FORWARD), items)
            job.guard_against_optimizers()
            self.blocks.append(job)
            self._parameter_job = job
        else:
            self.blocks += self._summarizer(fmt.FORWARD)(items)

    def _summarizer(self, kind: str) -> Any:
        def summarize(items: list[tuple[Registration, torch.Tensor]]) -> list[Block]:
            return summarize_values(kind, items, max_neurons=self.options.max_neurons, with_svd=self.options.with_svd)
        return summarize

    def record_gradients(self, kind: str, zero_non_parameters: bool, scale: scaling.GradientScale = scaling.NOT_GIVEN
                         ) -> None:
        """The gradients now, as group ``kind``, divided by ``scale``; a tensor whose gradient an earlier call of
        the same group recorded keeps this call's (see capture/gradients.py)."""
        if kind not in self.kinds:
            self.kinds.append(kind)
        items: list[tuple[Registration, torch.Tensor]] = []
        losses: list[tuple[str, torch.Tensor]] = []
        self._wait_for_parameters()  # record_current_gradients comes after optimizer.step(): long done
        for key, registration in self.registrations.items():
            if registration.tensor_type == "parameter":
                grad = registration.tensor.grad if registration.tensor is not None else None
                divisor = scale.parameters
            else:
                grad = self._grads.get(key)
                divisor = scale.activations
            if grad is None:
                continue
            if registration.tensor_type == "loss":
                losses.append((registration.tensor_name, grad))
            reason = unsummarisable(grad := shards.waited(grad))
            if reason is not None and self.dtensors is not None and shards.is_dtensor(grad):  # FSDP2's gradients
                reason = self.dtensors.add(kind, registration, scaling.unscaled(grad, divisor))
            if reason is None:
                items.append((registration, scaling.unscaled(grad, divisor)))
            else:
                self._skip(registration, f"gradients ({kind!r})", reason)
        self._check_scale(kind, scale, losses)
        self.blocks = scaling.supersede(self.blocks, kind, {registration.key for registration, _ in items})
        # All gradients here, from their values now, in one batched call. The user holds the parameters'
        # (a later backward pass, clip_grad_norm_ or zero_grad(set_to_none=False) would change them in
        # place, through .data with no version counter to tell), so they cannot wait for a worker. Starting
        # each on the worker as the backward pass made it cost more in all: three checksum passes to prove
        # it unchanged, and a summary call per tensor (measured on ResNet-18: 0.5 ms of fixed cost each).
        # The gradients from our hooks are here too: on the worker they could overlap only the graph walk,
        # which is Python as most of their summary is, so the two threads took turns at the GIL; one call
        # also pays the per-call costs once.
        if items:
            self.blocks += self._summarizer(kind)(items)
        if zero_non_parameters:
            self._grads.clear()

    def _check_scale(self, kind: str, scale: scaling.GradientScale, losses: list[tuple[str, torch.Tensor]]) -> None:
        """Warn where the gradients may be scaled without comgra knowing by what."""
        if self.report is None:
            return
        suspected = None if scale.known else scaling.suspected_scale(losses)
        if suspected is not None:
            self.report(f"loss-scale:{kind}", scaling.warning_of_unknown_scale(kind, *suspected))

    def to_tables(self, choice: SampleChoice, now: float | None = None, *, later: Callable[[int], bool] | None = None
                  ) -> tuple[pa.Table, pa.Table] | LaterRows:
        """The tensors rows and the steps rows of this step (one host transfer). ``later(size)``: whether the writer
        takes ``size`` bytes now; where it does and ``later_size`` allows, the rows to build on its thread."""
        rows = [{
            "training_step": self.training_step, "type_of_execution": self.type_of_execution,
            "iteration": i, "graph": document["hash"], "batch_size": self.batch_size,
            "kinds": list(self.kinds), "samples": list(choice.indices), "categories": choice.categories,
            "wall_time": now if now is not None else time.time(),
        } for i, document in enumerate(self.graph_documents)]
        pending, self._pending_forward = self._pending_forward, []
        blocks = self._finished_blocks()  # a worker's job is settled here, where its tensors' versions are read
        size = later_size(pending, blocks, self.options.with_svd) if later is not None else None
        if size is not None and not later(size):  # type: ignore[misc]
            size = None
        if size is None and pending:
            blocks += self._summarizer(fmt.FORWARD)(pending)
            pending = []
        extra = self.dtensors.blocks(self.training_step) if self.dtensors is not None else []
        training_step, of_type, options = self.training_step, self.type_of_execution, self.options

        def build() -> tuple[pa.Table, pa.Table]:
            every = blocks + (summarize_values(fmt.FORWARD, pending, max_neurons=options.max_neurons,
                                               with_svd=options.with_svd) if pending else []) + extra
            values = to_table(training_step, every, choice)
            values = values.append_column(fmt.ADDED_COLUMNS["tensors"][0], pa.repeat(  # a step is (step, type)
                pa.scalar(of_type, pa.string()), values.num_rows))
            return values, pa.Table.from_pylist(rows, schema=fmt.STEPS_SCHEMA)
        return LaterRows(build, size) if size is not None and not extra else build()

    def _wait_for_parameters(self) -> None:
        if self._parameter_job is not None:
            self._parameter_job.wait()
            self._parameter_job = None

    def _finished_blocks(self) -> list[Block]:
        blocks: list[Block] = []
        for item in self.blocks:
            blocks += item.result() if isinstance(item, background.Job) else [item]
        return blocks

    def close(self) -> None:
        self._parameter_job = None
        for item in self.blocks:  # a job still running keeps its tensors until it ends; no hook stays behind
            if isinstance(item, background.Job):
                item.wait()
                item.close()
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self._grads.clear()
        self._pending_forward.clear()
        self._by_tensor_id.clear()
        self.checkpoints.clear()
        self.keep_alive.clear()
        for tensor in self.switched_on_grad:  # leave the user's tensors as they were before the step
            if tensor.is_leaf:  # else an autograd.Function's forward under no_grad returned it: it has a grad_fn now
                tensor.requires_grad_(False)
                tensor.grad = None
        self.switched_on_grad.clear()
        for registration in self.registrations.values():
            registration.tensor = None
            registration.grad_fn = None
        self.connections = graphs.Connections()
        self.blocks.clear()

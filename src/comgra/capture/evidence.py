"""The state of the run on each recorded step, and the every-step sentinels: evidence of bugs that leave
no mark in the tensors' values.

On a recorded step the ``runinfo`` table gets (format.RUNINFO_SCHEMA): each tracked module's mode (train or
eval) and class, each tracked parameter's dtype, ``requires_grad``, optimizer groups (for the optimizers given
to ``recorder.track_optimizer`` and those torch's global step hook saw step on a recorded step; comma-separated;
``""`` for a parameter in none of them) and float64 fingerprints of its value
and gradient (sum and norm: the ranks of a data-parallel run must agree on them), each registered tensor's
dtype and ``requires_grad``, each optimizer group's learning rate and weight decay, the autocast state and
whether gradients were enabled while the step's tensors were registered, and the batch size. About a
hundred bytes per module and parameter per recorded step; nothing on the other steps. The fingerprints are
float64 numbers; a distributed run reduces every tensor in float64, a one-process run the large ones in their
own precision (see EXACT_ELEMENTS) and leaves out the gradients' sums, which only rank agreement reads.

The sentinels (``comgra.breakpoints.sentinels``, given to this object by the recorder) run on every step.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from comgra.capture import fused
from comgra.capture.modules import ModuleTracker
from comgra.errors import RecordingError
from comgra.store import format as fmt

__all__ = ["RunEvidence"]


class RunEvidence:
    """Created by the recorder when it records; ``sentinels`` is a ``comgra.breakpoints.sentinels.Sentinels``."""

    def __init__(self, session: Any, modules: ModuleTracker, sentinels: Any):
        self.session, self.modules, self.sentinels = session, modules, sentinels
        self._later_fault: Exception | None = None
        self.optimizers: list[Any] = []
        self.broken = False
        self._rows: list[tuple[str, str, str, str, float]] | None = None  # this step's, when it is recorded
        self._step: tuple[int, str | None] = (0, None)
        self._tensors_seen: set[str] = set()
        self._grad_enabled = True  # at every registration of this step so far
        self._history = False  # a tensor registered in this step carries autograd history (it was computed to train)
        self._autocast: dict[str, str] = {}  # device type -> autocast dtype, where autocast was on at a registration
        self._autocast_devices = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
        self._value_fingerprints: tuple[list[str], torch.Tensor | None] = ([], None)
        self._grad_fingerprints: tuple[list[str], torch.Tensor | None] | None = None  # None: not taken yet this step
        self.exact = False  # float64 reductions of every tensor (a distributed run: see EXACT_ELEMENTS)
        self._names: dict[tuple[Any, ...], tuple[pa.Array, pa.Array, pa.Array]] = {}  # _put's naming columns, reused
        self._optimizer_hook: Any = None  # torch's global optimizer hook's handle, while steps are recorded

    @classmethod
    def attach(cls, recorder: Any, sentinels: Any) -> RunEvidence:
        """Off (``broken``: every call returns at once) where the recorder does not record (comgra off, or a trial
        folder it cannot write); the user's calls are still checked."""
        session = recorder.session
        evidence = cls(session, recorder.modules, sentinels)
        if session is None or session.broken:
            evidence.broken = True
            return evidence
        evidence.exact = recorder.rank_info.world_size > 1
        recorder._on_finalize.append(evidence.close)  # before the session closes: the last rows go with it
        # a step's small CPU tensors reduced at its end, in one call of the C kernel
        sentinels.defer_up_to, sentinels.defer_floats_up_to = fused.EXTREMES_UP_TO, fused.EXTREMES_FLOAT_UP_TO
        sentinels.spec, sentinels.reduce_many = fused.extremes_spec, fused.many_extremes
        session.on_graph, session.on_flush = sentinels.learn_outputs, sentinels.flush
        return evidence

    def close(self) -> None:
        self._watch_optimizers(False)
        if not self.broken:
            try:
                self.sentinels.close()
            except Warning:  # a warning the user made an error (pytest's -W error): theirs to see
                raise
            except Exception as error:  # noqa: BLE001 - a fault of comgra's own never stops the training
                self._fault(error)

    def track_optimizer(self, optimizer: Any) -> None:
        if not isinstance(getattr(optimizer, "param_groups", None), list):
            raise RecordingError(f"track_optimizer() needs a torch.optim.Optimizer (with param_groups), got "
                                 f"{type(optimizer).__name__}.")
        if not any(known is optimizer for known in self.optimizers):
            self.optimizers.append(optimizer)

    def _optimizer_steps(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        """torch's global step pre-hook, on while a step is recorded: an optimizer that steps on a recorded step is
        tracked from then on (its groups, learning rates and parameters go into the next recorded steps' rows)."""
        if self._rows is not None and not self.broken and not any(known is optimizer for known in self.optimizers):
            self.optimizers.append(optimizer)

    def _watch_optimizers(self, on: bool) -> None:
        """Every optimizer that steps during a recorded step, without track_optimizer: torch's global hook, put on
        at a recorded step's start and taken off at the next step that is not (on the others no call at all)."""
        if on and self._optimizer_hook is None:
            try:
                from torch.optim.optimizer import register_optimizer_step_pre_hook
            except ImportError:  # a torch without global optimizer hooks (before 2.0): track_optimizer only
                return
            self._optimizer_hook = register_optimizer_step_pre_hook(self._optimizer_steps)
        elif not on and self._optimizer_hook is not None:
            self._optimizer_hook.remove()
            self._optimizer_hook = None

    # -- the training step -----------------------------------------------------------------------------
    def start_batch(self, training_step: int, type_of_execution: str | None, batch_size: int, recording: bool) -> None:
        if self.broken:
            return
        try:
            if self._later_fault is not None:  # the last recorded step's rows failed on the writer's thread
                raise self._later_fault
            self.sentinels.start_batch(training_step, type_of_execution, batch_size, recording)
            self._step, self._rows = (training_step, type_of_execution), None
            if recording or self._optimizer_hook is not None:  # (the usual unrecorded step: no call, see
                self._start_batch(batch_size, recording)  # step_control.opened)
        except Warning:  # a warning the user made an error (pytest's -W error): theirs to see
            raise
        except Exception as error:  # noqa: BLE001 - a fault of comgra's own never stops the training
            self._fault(error)

    def _fault(self, error: Exception) -> None:
        """Said once; the evidence and the sentinels are off for the rest of the run, recording goes on."""
        self.broken, self._rows = True, None
        self.session.warn_once("evidence", f"comgra stopped keeping the run's evidence and sentinels after an internal "
                                           f"error: {type(error).__name__}: {error}. Recording and training go on.")

    def _start_batch(self, batch_size: int, recording: bool) -> None:
        """The optimizers watched (or no longer), and a recorded step's modes, dtypes, groups and fingerprints."""
        self._watch_optimizers(recording)
        if not recording:
            return
        self._rows = rows = [("step", "", "batch_size", str(batch_size), float(batch_size))]
        self._tensors_seen = set()
        self._grad_enabled, self._history, self._autocast = True, False, {}
        for root, module in self.modules.roots.items():
            for name, sub in module.named_modules():
                full = f"{root}.{name}" if name else root
                rows.append(("module", full, "mode", "train" if sub.training else "eval", float(sub.training)))
                rows.append(("module", full, "type", type(sub).__name__, math.nan))
                rate = getattr(sub, "p", None)  # a dropout's probability: at 0 its mode changes nothing
                if isinstance(rate, float):
                    rows.append(("module", full, "p", repr(rate), rate))
        groups = self._optimizer_groups(rows)
        for name, parameter in self.modules.parameters.items():
            rows.append(("parameter", name, "dtype", str(parameter.dtype).replace("torch.", ""), math.nan))
            rows.append(("parameter", name, "requires_grad", str(parameter.requires_grad), float(parameter.requires_grad)))
            if self.optimizers:
                rows.append(("parameter", name, "optimizer_group", groups.get(id(parameter), ""), math.nan))
        # A sharded parameter (DTensor: FSDP2, tensor parallel) differs across ranks by design: no fingerprint.
        plain = [(n, p) for n, p in self.modules.parameters.items() if not hasattr(p, "to_local")]
        self._value_fingerprints = ([n for n, _ in plain], _fingerprints([p.detach() for _, p in plain], self.exact))

    def _optimizer_groups(self, rows: list[tuple[str, str, str, str, float]]) -> dict[int, str]:
        groups: dict[int, str] = {}
        for index, optimizer in enumerate(self.optimizers):
            for number, group in enumerate(optimizer.param_groups):
                label = f"optimizer{index}.group{number}"
                parameters = list(group.get("params", []))
                for parameter in parameters:  # a parameter in several groups (two optimizers) lists them all
                    groups[id(parameter)] = f"{groups[id(parameter)]},{label}" if id(parameter) in groups else label
                for key in ("lr", "weight_decay"):
                    value = group.get(key)
                    number_value = float(value) if isinstance(value, (int, float)) or torch.is_tensor(value) else math.nan
                    rows.append(("optimizer_group", label, key, str(value), number_value))
                rows.append(("optimizer_group", label, "parameters", str(len(parameters)), float(len(parameters))))
                rows.append(("optimizer_group", label, "type", type(optimizer).__name__, math.nan))
        return groups

    def register(self, name: str, tensor: torch.Tensor, is_loss: bool, recording: bool, is_input: bool = False) -> None:
        if self.broken or not isinstance(tensor, torch.Tensor):
            return  # (the recorder reports a non-tensor)
        watched = self.sentinels.wants(name, is_loss, is_input)  # one rule, the one tests/breakpoints checks
        rows = self._rows
        if rows is None and not watched:
            return  # the usual case of a step that is not recorded
        try:
            if watched:
                self.sentinels.register(name, tensor, is_loss, is_input)
            if rows is not None and recording and name not in self._tensors_seen:
                self._register(name, tensor, rows)
        except Warning:  # a warning the user made an error (pytest's -W error): theirs to see
            raise
        except Exception as error:  # noqa: BLE001 - a fault of comgra's own never stops the training
            self._fault(error)

    def _register(self, name: str, tensor: torch.Tensor, rows: list[tuple[str, str, str, str, float]]) -> None:
        # The state the step's tensors were computed in: gradients off at any registration (evaluation under no_grad,
        # the inputs registered before it), autocast on at any (the inputs registered before entering it).
        self._grad_enabled = self._grad_enabled and torch.is_grad_enabled()
        self._history = self._history or tensor.grad_fn is not None
        for device in self._autocast_devices:
            if device not in self._autocast and torch.is_autocast_enabled(device):
                self._autocast[device] = str(torch.get_autocast_dtype(device)).replace("torch.", "")
        self._tensors_seen.add(name)
        rows.append(("tensor", name, "dtype", str(tensor.dtype).replace("torch.", ""), math.nan))
        rows.append(("tensor", name, "requires_grad", str(tensor.requires_grad), float(tensor.requires_grad)))

    def finish_batch(self, recorded: bool, type_of_execution: str | None, *, pausable: bool) -> None:
        """``recorded``: whether the step was recorded after all (a dynamic recording decides at its end). Called
        before the breakpoints settle, so that a sentinel's error can pause this step."""
        if self.broken:
            return
        if not recorded:
            self._rows = None
        self._step = (self._step[0], type_of_execution)
        try:
            if self._rows is not None:  # (the usual unrecorded step: no call)
                self._finish_rows()
            self.sentinels.finish_batch(pausable=pausable)
        except Warning:  # a warning the user made an error (pytest's -W error): theirs to see
            raise
        except Exception as error:  # noqa: BLE001 - a fault of comgra's own never stops the training
            self._fault(error)

    def gradients(self, scale: float = 1.0) -> None:
        """The parameters' gradient fingerprints, at each record_current_gradients of a recorded step (the last one's
        are kept, as the recorder keeps the last call's gradients; after the backward pass, before an optimizer's
        zero_grad can clear them), divided by ``scale`` (a GradScaler's, where the gradients are still scaled);
        without such a call, at finish_batch, if the gradients are still there."""
        if self.broken or self._rows is None:
            return
        try:
            with_grad = [(n, p.grad) for n, p in self.modules.parameters.items()
                         if p.grad is not None and not hasattr(p.grad, "to_local")]
            found = _fingerprints([g.detach() for _, g in with_grad], self.exact, sums=self.exact)
            self._grad_fingerprints = ([n for n, _ in with_grad], found / scale if found is not None and scale != 1.0
                                       else found)
        except Warning:  # a warning the user made an error (pytest's -W error): theirs to see
            raise
        except Exception as error:  # noqa: BLE001 - a fault of comgra's own never stops the training
            self._fault(error)

    def _finish_rows(self) -> None:
        """A recorded step's rows: its gradients' fingerprints where no record_current_gradients took them, then the
        rows to the writer."""
        if self._grad_fingerprints is None:
            self.gradients()
        rows, self._rows = self._rows, None
        if rows is None:
            return  # gradients() met a fault of comgra's own (said once: the evidence is off)
        if self._tensors_seen:
            # A training step that also computes something under no_grad (a metric, model.generate()) is a training
            # step still: autograd history on any of its tensors says so.
            trains = self._grad_enabled or self._history
            rows.append(("step", "", "grad_enabled", str(trains), float(trains)))
            for device in self._autocast_devices:
                enabled = device in self._autocast
                rows.append(("autocast", device, "enabled", str(enabled), float(enabled)))
                if enabled:
                    rows.append(("autocast", device, "dtype", self._autocast[device], math.nan))
        found_values, self._value_fingerprints = self._value_fingerprints, ([], None)
        found_grads, self._grad_fingerprints = self._grad_fingerprints or ([], None), None
        step, exact = self._step, self.exact

        def make() -> pa.Table:
            try:
                for subject, found in (("value", found_values), ("grad", found_grads)):
                    if found[1] is None:
                        continue
                    # grad_sum: read by rank agreement only (a distributed run); a one-process run does not
                    # compute it
                    with_sum = subject == "value" or exact
                    for name, (total, norm) in zip(found[0], found[1].tolist()):
                        if with_sum:
                            rows.append(("parameter", name, f"{subject}_sum", repr(total), total))
                        rows.append(("parameter", name, f"{subject}_norm", repr(norm), norm))
                return self._table(rows, step)
            except Exception as error:  # noqa: BLE001 - on the writer's thread: said at the next start_batch
                self._later_fault = error
                return fmt.RUNINFO_SCHEMA.empty_table()

        # On the CPU the rows are made on the writer's thread (a device's fingerprints are read here: a host sync)
        if all(found[1] is None or found[1].is_cpu for found in (found_values, found_grads)):
            self.session.put_later("runinfo", make, 64 * len(rows))
        else:
            self.session.put_table("runinfo", make())

    def _table(self, rows: list[tuple[str, str, str, str, float]], of_step: tuple[int, str | None]) -> pa.Table:
        """Each column made in the schema's type at once: a table of inferred types cast to the schema cost 2-4x
        as much (75-150 us against 36 us for 60 rows). The naming columns (subject, name, field) are made once per
        set of rows and reused at the next recorded steps."""
        step, kind = of_step
        subject, name, field, value, number = zip(*rows)
        count = len(rows)
        names = self._names.get((subject, name, field))  # the same every recorded step of a fixed model and optimizer
        if names is None:
            if len(self._names) >= 16:  # a run whose rows change every step would otherwise grow it without end
                self._names.clear()
            names = self._names[(subject, name, field)] = (pa.array(subject, pa.string()), pa.array(name, pa.string()),
                                                           pa.array(field, pa.string()))
        columns = {"training_step": pa.array(np.full(count, step, dtype=np.int64)),
                   "type_of_execution": pa.nulls(count, pa.string()) if kind is None else pa.array([kind] * count,
                                                                                                   pa.string()),
                   "subject": names[0], "name": names[1], "field": names[2], "value": pa.array(value, pa.string()),
                   "number": pa.array(number, pa.float64())}
        return pa.Table.from_arrays([columns[f.name] for f in fmt.RUNINFO_SCHEMA], schema=fmt.RUNINFO_SCHEMA)


# A tensor up to this many elements is reduced in float64 (its cast costs little); a larger one in a one-process run is
# reduced in its own float32 (float64 for float64 parameters: pairwise sums, about 1e-7 relative), which is what the
# readers of a one-process run need (the frozen-parameter detector compares to 1e-7, the health tab shows norms) at a
# fifth of the cost (the values of cost_breakdown.py's 4.9M-parameter conv net: 9.6 ms -> 1.9 ms of thread CPU).
# A distributed run keeps float64 throughout: rank agreement compares the ranks' fingerprints to 1e-9.
EXACT_ELEMENTS = 65536


def _fingerprints(tensors: list[torch.Tensor], exact: bool = True, sums: bool = True) -> torch.Tensor | None:
    """(sum, L2 norm) of each tensor, stacked as float64 on one device: one transfer for all; ``exact``: reduced in
    float64 whatever the size (see EXACT_ELEMENTS); without ``sums`` the first column repeats the norm (not computed).
    A complex tensor's are those of its magnitudes |z|, as everywhere in comgra.

    Where every tensor is contiguous float32 in the CPU's memory (the usual case there), one call of the C kernel
    (capture/fused.py ``wide_sums``) widens every value to float64 before adding it, where torch would reduce in
    float64 (``exact``, or no tensor above EXACT_ELEMENTS): float64 precision at a quarter of torch's cost, which copies
    each tensor to float64 first (the MLP's 10 parameters, hot: 530 -> 130 us per call). Elsewhere, the real floating tensors reduced in
    float64 on the first one's device take one ``_foreach_norm`` for all their norms; the others one reduction each."""
    if not tensors:
        return None
    # Float32 in the CPU's memory, the usual case there: one pass for all, where torch would reduce in float64 (the
    # kernel's float64 lanes are slower than torch's float32 reduction of a large tensor: 4.1M values 2.3 ms, 1.6 ms).
    on_host = fused.wide_sums(tensors) if exact or all(t.numel() <= EXACT_ELEMENTS for t in tensors) else None
    if on_host is not None:
        norms = np.sqrt(on_host[:, 1])
        return torch.from_numpy(np.stack([on_host[:, 0] if sums else norms, norms], 1))
    device = tensors[0].device
    pairs: list[torch.Tensor | None] = [None] * len(tensors)
    batched = [i for i, t in enumerate(tensors) if t.device == device and t.dtype in _FOREACH_DTYPES
               and (exact or t.numel() <= EXACT_ELEMENTS)]
    if batched:
        group = [tensors[i] for i in batched]
        norms = torch.stack(torch._foreach_norm(group, 2, dtype=torch.float64))
        totals = torch.stack([t.sum(dtype=torch.float64) for t in group]) if sums else norms
        if len(batched) == len(tensors):  # the usual case: no per-tensor rows to put in between
            return torch.stack([totals, norms], 1)
        for i, pair in zip(batched, torch.stack([totals, norms], 1)):
            pairs[i] = pair
    for i, t in enumerate(tensors):
        if pairs[i] is not None:
            continue
        if t.is_complex():
            t = t.abs()
        wide = exact or t.numel() <= EXACT_ELEMENTS or not t.is_floating_point()
        dtype = torch.float64 if wide else (None if t.dtype in (torch.float32, torch.float64) else torch.float32)
        norm = torch.linalg.vector_norm(t, dtype=dtype)
        pair = torch.stack([t.sum(dtype=dtype) if sums else norm, norm])
        pairs[i] = (pair if pair.dtype == torch.float64 else pair.double()).to(device)
    return torch.stack(pairs)  # type: ignore[arg-type]


_FOREACH_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

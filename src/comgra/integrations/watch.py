"""``comgra.watch(model)``: every module's output recorded under its dotted name, with one call.

A forward hook on each selected module registers the module's output on the steps the recording
policy picks, as ``register_tensor`` would: the dependency graph is built from autograd as for tensors
named by hand, and the user's own ``register_tensor`` calls go on working beside it. The hooks are on
the modules only during a recorded step (``start_batch`` puts them on, ``finish_batch`` takes them off:
about 0.3 ms per recorded step for a 12-layer GPT-2's 151 modules), so a step that is not recorded runs
the model exactly as without comgra.

Names: the output of ``model.transformer.h.0`` is ``<name>.transformer.h.0`` (``<name>``: the name the
model is tracked under, ``"model"`` by default; the model's own output is ``<name>``); an element of a
tuple, list or dict output (a ``transformers`` ``ModelOutput`` too) or a field of a dataclass output gets its
key in brackets, ``<name>.transformer.h.0.attn[0]``, ``<name>[logits]``; an output of any other type holds
nothing comgra can record (a warning says so, once per module); a module called again in the same iteration
gets ``@2``, ``@3``, ... A model wrapped by ``torch.compile``, DDP or FSDP1 is watched under its own module
names (``model.0``, not ``model._orig_mod.0`` or ``model.module.0``), as its parameters are. A tensor whose first dimension is the step's batch size (``start_batch``'s
``current_batch_size``) is recorded per sample; any other (GPT-2's position embeddings, of batch size 1;
a scalar loss) is recorded without a batch dimension. Integer and boolean outputs (token ids, masks)
are skipped: they carry no gradient and no edge. An output without autograd history (an evaluation step
under ``torch.no_grad()``, a frozen module) is recorded by value, without edges, and its
``requires_grad`` is left alone.

Calls with autograd off that are side computations are not recorded, so that they do not flood the step's
graph: in an iteration that already recorded calls with autograd on (a metric under ``torch.no_grad()`` after
the forward or backward pass, ``model.generate()`` inside a training step), no call with autograd off is
recorded; and in any iteration, a module called again with autograd off after its first call (a decoding loop:
``generate()`` calls every module once per new token) is recorded on its first call only.

Roles: the model's own tensor inputs are recorded as ``<name>.input`` (``<name>.input[1]``, ``<name>.input[key]``
for more than one) with the role input, before its forward pass, so that the graph starts from them; the
tensor that ``backward()`` runs from (a scalar, the first per iteration) is recorded as ``loss`` with the role
loss, unless a loss was registered by hand, and on every step (recorded or not) as the KPI curve ``loss`` of
the Graphs tab; the output that feeds it directly gets the role output. Every node carries its module's class
(``model.1`` is a ``ReLU``): the app shows ``model.1 (ReLU)``, the node's id stays ``model.1``.

Where one module returns the output of another (BERT's layer returns its last LayerNorm's tensor), the
outer name follows the inner one in the graph, and what consumes the tensor depends on the outer name:
``...layer.0.output.LayerNorm -> ...layer.0.output -> ...layer.0 -> ...layer.1.attention.self.query``.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import warnings
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from comgra.errors import ConfigError, RecordingError, did_you_mean
from comgra.integrations.steps import IntegrationWarning
from comgra.recorder import ComgraRecorder, _unwrapped

__all__ = ["Watch", "watch_model"]

_MAX_NESTING = 3  # outputs nested deeper than this (caches of caches) are not looked into
LOSS_NAME = "loss"  # the tensor backward() runs from: its node, and its KPI curve (group "loss")
_WATCHING: weakref.WeakSet[Watch] = weakref.WeakSet()  # the active watches, told of each backward()
_ORIGINAL_BACKWARD: Any = None  # torch.autograd.backward, before _install_backward_hook wrapped it


class Watch:
    """The hooks of one ``comgra.watch`` call, on the modules during the recorder's recorded steps.

    ``remove()`` stops watching (also as a context manager, at the end of the ``with`` block); the
    recorder's ``finalize()`` does too. ``modules`` lists the watched modules' paths; ``active`` is False
    once removed (and from the start where comgra is off).

        >>> handle = comgra.watch(model)  # doctest: +SKIP
        >>> handle.remove()  # doctest: +SKIP
    """

    def __init__(self, recorder: ComgraRecorder, model: torch.nn.Module, name: str, modules: dict[str, torch.nn.Module]):
        self.recorder = recorder
        self.model = model
        self.name = name
        self.modules = list(modules)
        self._calls: dict[str, int] = {}  # calls of each module in the current iteration
        self._iteration = -1  # the recorder's iteration serial that _calls counts
        self._with_grad = False  # the current iteration recorded a call with autograd on
        self._unrecordable: set[str] = set()  # modules whose output type was reported as holding nothing recordable
        self._hooks = [(module, self._hook(_tensor_name(name, path), type(module).__name__))
                       for path, module in modules.items()]
        self._handles: list[Any] = []  # the hooks on the modules: during a recorded step only
        self._loss_iteration = -1  # the recorder's iteration serial whose loss was seen
        self.finds_loss = True  # False: a callback registers the loss itself (unscaled, once per optimizer step)
        self.active = bool(modules)  # False after remove(), or where there is nothing to watch
        self._sentinel_handle: Any = None  # the model's inputs to the every-step sentinels: on every step
        self._compiled_inputs: list[Any] = [None]  # (args, kwargs) of the model's last call inside torch.compile
        if self.active:
            self._sentinel_handle = model.register_forward_pre_hook(self._sentinel_hook, with_kwargs=True)
            _WATCHING.add(self)
            _install_backward_hook()
            recorder._on_finalize.append(self.remove)
            recorder._step_listeners.append(self._step)
            if recorder.current_stage != "inactive":  # watched in the middle of a step
                self._step(recorder._takes_watched_tensors() or recorder.recording_is_active())

    def remove(self) -> None:
        """Stop watching: the hooks come off and stay off. Safe to call more than once."""
        self.active = False
        _WATCHING.discard(self)
        if not any(watch.active for watch in _WATCHING):
            _uninstall_backward_hook()  # the last watch gone: torch.autograd.backward is torch's own again
        self._step(False)
        if self._sentinel_handle is not None:
            self._sentinel_handle.remove()
            self._sentinel_handle = None
        for listeners, action in ((self.recorder._on_finalize, self.remove), (self.recorder._step_listeners, self._step)):
            if action in listeners:
                listeners.remove(action)

    def _step(self, takes_tensors: bool) -> None:
        """The recorder's word at start_batch (does this step take tensors?) and at finish_batch (False)."""
        stage = self.recorder.current_stage
        if stage in ("started", "inactive"):  # start_batch: nothing kept yet; finish_batch: a compiled call's inputs
            pending, self._compiled_inputs[0] = self._compiled_inputs[0], None
            if pending is not None and stage == "inactive":
                self._to_sentinels(*pending)
        if takes_tensors and self.active and not self._handles:
            self._handles = [module.register_forward_hook(hook) for module, hook in self._hooks]
            self._handles.append(self.model.register_forward_pre_hook(self._input_hook, with_kwargs=True))
        elif not takes_tensors and self._handles:
            handles, self._handles = self._handles, []
            for handle in handles:
                handle.remove()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"<comgra.Watch {self.name!r}: {len(self._hooks)} modules{'' if self.active else ', removed'}>"

    def _hook(self, tensor_name: str, module_type: str) -> Any:
        recorder = self.recorder

        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if recorder._takes_watched_tensors():  # False outside an iteration, or after a dynamic step said no
                self._record(tensor_name, output, module_type)

        return hook

    def _input_hook(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        """The model's tensor inputs, registered with the role input before its forward pass runs."""
        recorder = self.recorder
        if not recorder._takes_watched_tensors():
            return
        if self._iteration == recorder._iteration_serial and self._calls.get(self.name):
            return  # the model called again in this iteration (a recurrence): its inputs are its own outputs
        found = [pair for index, value in enumerate(args) for pair in _tensors_of(value, f"[{index}]", 1)]
        found += [pair for key, value in (kwargs or {}).items() for pair in _tensors_of(value, f"[{key}]", 1)]
        found = [(key, tensor) for key, tensor in found if tensor.is_floating_point()
                 and not _registered(recorder, tensor)]  # an input the user named keeps the user's name
        for key, tensor in found:
            batch_dim = 0 if tensor.dim() > 0 and tensor.shape[0] == recorder._batch_size else None
            recorder._register_watched(f"{self.name}.input{'' if len(found) == 1 else key}", tensor, batch_dim,
                                       is_input=True)

    def _sentinel_hook(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        """Every step, recorded or not: the model's tensor inputs (token ids, masks and labels too) go to the
        every-step sentinels, under the names the recorded steps give them (an input zeroed on some steps). Inside a
        graph torch.compile traces, the call's arguments are only kept (a store that TorchDynamo replays after the
        graph runs: no graph break, no guard beyond the inputs' own shapes) and reach the sentinels at
        finish_batch, eagerly; the model's last call in the step stands for it."""
        if torch.compiler.is_compiling():
            self._compiled_inputs[0] = (args, kwargs)
            return
        if self.recorder.current_stage == "forward":
            self._to_sentinels(args, kwargs)

    def _to_sentinels(self, args: Any, kwargs: Any) -> None:
        recorder = self.recorder
        evidence = recorder._evidence
        if evidence is None or evidence.sentinels.step is None or not evidence.sentinels.inputs:
            return
        found = [pair for index, value in enumerate(args) for pair in _tensors_of(value, f"[{index}]", 1)]
        found += [pair for key, value in (kwargs or {}).items() for pair in _tensors_of(value, f"[{key}]", 1)]
        floats = sum(1 for _, tensor in found if tensor.is_floating_point())
        for key, tensor in found:
            alone = floats == 1 and tensor.is_floating_point()  # the name _input_hook gives a lone float input
            evidence.register(f"{self.name}.input{'' if alone else key}", tensor, False, recorder._recording, True)

    def saw_backward(self, tensor: torch.Tensor) -> None:
        """``tensor.backward()`` (or ``torch.autograd.backward(tensor)``) runs now: the first scalar of an
        iteration is the loss. Recorded as the node ``loss`` on a recorded step (unless the user registered a
        loss), seen by the every-step sentinels otherwise, and as the KPI curve ``loss`` on every step."""
        recorder = self.recorder
        if not self.finds_loss or recorder.current_stage != "forward" or not isinstance(tensor, torch.Tensor) \
                or tensor.numel() != 1 \
                or not tensor.is_floating_point() or tensor.grad_fn is None:
            return
        if self._loss_iteration == recorder._iteration_serial:
            return
        self._loss_iteration = recorder._iteration_serial
        value = tensor.detach().reshape(())
        recorder.record_kpi_in_graph(LOSS_NAME, LOSS_NAME, value, record_even_if_recording_is_inactive=True)
        if not recorder._takes_watched_tensors():
            recorder._watched_sentinel(LOSS_NAME, tensor, True)
        elif not _has_loss(recorder):
            recorder._register_watched(LOSS_NAME, tensor.reshape(()) if tensor.dim() else tensor, None, is_loss=True)

    def _record(self, base: str, output: Any, module_type: str = "") -> None:
        serial = self.recorder._iteration_serial
        if serial != self._iteration:
            self._iteration, self._with_grad = serial, False
            self._calls.clear()
        grad = torch.is_grad_enabled()
        if not grad and (self._with_grad or base in self._calls):
            return  # a side computation or a decoding loop (see the module's docstring)
        self._with_grad = self._with_grad or grad
        count = self._calls[base] = self._calls.get(base, 0) + 1
        name = base if count == 1 else f"{base}@{count}"
        batch_size = self.recorder._batch_size
        tensors = list(_tensors_of(output, "", 0))
        if not tensors and not _holds_no_tensor_by_design(output) and base not in self._unrecordable:
            self._unrecordable.add(base)
            warnings.warn(f"comgra.watch: {base} returned a {type(output).__name__}, which comgra cannot look into "
                          "(it records tensors, and tuples, lists, dicts and dataclasses of them); its output is not "
                          "recorded. Register what matters with comgra.my_recorder.register_tensor(...).",
                          IntegrationWarning, stacklevel=2)
        for key, tensor in tensors:
            if not (tensor.is_floating_point() or tensor.is_complex()):  # complex: recorded as |z|
                continue  # token ids, masks: no gradient, no edge (see the module's docstring)
            if tensor.grad_fn is None and not tensor.requires_grad:
                tensor = tensor.detach()  # recorded by value; the model's own tensor keeps requires_grad=False
            batch_dim = 0 if tensor.dim() > 0 and tensor.shape[0] == batch_size else None
            self.recorder._register_watched(name + key, tensor, batch_dim, module_type=module_type)


def _registered(recorder: ComgraRecorder, tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` itself is registered in the current step already."""
    step = getattr(recorder.session, "step", None)
    return step is not None and any(r.tensor is tensor for r in step.registrations.values())


def _has_loss(recorder: ComgraRecorder) -> bool:
    """Whether a loss was registered in the current iteration already (by hand, or by a callback)."""
    step = getattr(recorder.session, "step", None)
    if step is None:
        return False
    return any(r.tensor_type == "loss" and r.iteration == step.iteration for r in step.registrations.values())


def _install_backward_hook() -> None:
    """Wrap ``torch.autograd.backward`` (what ``Tensor.backward`` calls) while a watch is active: the active watches
    see the tensor a backward pass runs from. A fault of comgra's there is reported and never stops training. The
    last watch removed puts torch's own function back (``_uninstall_backward_hook``)."""
    global _ORIGINAL_BACKWARD
    if _ORIGINAL_BACKWARD is not None:
        return
    original = _ORIGINAL_BACKWARD = torch.autograd.backward

    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if _WATCHING:
            tensor = tensors if isinstance(tensors, torch.Tensor) else (
                tensors[0] if isinstance(tensors, (list, tuple)) and len(tensors) == 1 else None)
            for watch in list(_WATCHING):
                if tensor is not None and watch.active:
                    try:
                        watch.saw_backward(tensor)
                    except Exception as error:  # noqa: BLE001 - comgra's fault must not stop the user's backward
                        watch.remove()
                        warnings.warn(f"comgra.watch stopped recording the loss after an internal error: {error!r}",
                                      RuntimeWarning, stacklevel=2)
        return original(tensors, *args, **kwargs)

    backward.__wrapped__ = original  # type: ignore[attr-defined]
    backward.__doc__ = original.__doc__
    torch.autograd.backward = backward  # type: ignore[assignment]


def _uninstall_backward_hook() -> None:
    """Put back the ``torch.autograd.backward`` that ``_install_backward_hook`` wrapped, unless someone wrapped it
    again since (then ours stays in their chain, and does nothing without an active watch)."""
    global _ORIGINAL_BACKWARD
    original = _ORIGINAL_BACKWARD
    if original is not None and getattr(torch.autograd.backward, "__wrapped__", None) is original:
        torch.autograd.backward = original  # type: ignore[assignment]
        _ORIGINAL_BACKWARD = None


def watch_model(model: torch.nn.Module, recorder: ComgraRecorder | None, *, name: str | None = None,
                include: str | Iterable[str] | None = None, exclude: str | Iterable[str] | None = None,
                max_depth: int | None = None, track_parameters: bool = True) -> Watch:
    """What ``comgra.watch`` does; see its docstring."""
    if recorder is None:
        raise RecordingError("comgra.watch(model) needs a recorder: set comgra.my_recorder = ComgraRecorder(...) "
                             "first, or pass recorder=...")
    if not isinstance(recorder, ComgraRecorder):
        raise RecordingError(f"recorder={recorder!r} is not a ComgraRecorder; pass the recorder that records the run.")
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"comgra.watch(model) needs a torch.nn.Module, got {type(model).__name__}.")
    if max_depth is not None and (not isinstance(max_depth, int) or isinstance(max_depth, bool) or max_depth < 0):
        raise ConfigError(f"max_depth={max_depth!r} must be None (every level) or an integer >= 0 (0: the model's "
                          "own output, 1: its children too, ...).")
    for action in recorder._on_finalize:
        earlier = getattr(action, "__self__", None)
        if isinstance(earlier, Watch) and earlier.model is model and earlier.active:
            raise RecordingError(f"This {type(model).__name__} is already watched as {earlier.name!r}; call remove() "
                                 "on the first handle before watching it again.")
    # The model's own module names, under a torch.compile / DDP wrapper too: the names its parameters are tracked by
    all_modules = dict(_innermost(model).named_modules())  # a module reused under two paths is hooked once, the first
    selected = _select(all_modules, _patterns(include, "include"), _patterns(exclude, "exclude"), max_depth)
    resolved = _name_of(recorder, model, name, track_parameters)
    if not recorder.comgra_is_active:
        selected = {}  # comgra is off: no hooks at all, nothing to pay
    return Watch(recorder, model, resolved, selected)


def _patterns(value: str | Iterable[str] | None, argument: str) -> list[str]:
    if value is None:
        return []
    patterns = [value] if isinstance(value, str) else list(value)
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise ConfigError(f"{argument}={value!r} must be a pattern or a list of patterns (strings, as in "
                              f"fnmatch: 'transformer.h.*'), got an item of type {type(pattern).__name__}.")
    return patterns


def _select(modules: dict[str, torch.nn.Module], include: list[str], exclude: list[str],
            max_depth: int | None) -> dict[str, torch.nn.Module]:
    paths = list(modules)
    for argument, patterns in (("include", include), ("exclude", exclude)):
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(path, pattern) for path in paths):
                raise ConfigError(f"{argument} pattern {pattern!r} matches no module path of the model (the names "
                                  "of model.named_modules(), '' for the model itself)"
                                  + did_you_mean(pattern, [p for p in paths if p]))
    chosen = {}
    for path, module in modules.items():
        depth = 0 if not path else path.count(".") + 1
        if max_depth is not None and depth > max_depth:
            continue
        if include and not any(fnmatch.fnmatchcase(path, p) for p in include):
            continue
        if any(fnmatch.fnmatchcase(path, p) for p in exclude):
            continue
        chosen[path] = module
    return chosen


def _name_of(recorder: ComgraRecorder, model: torch.nn.Module, name: str | None, track_parameters: bool) -> str:
    """The prefix of the tensor names: the name the model is tracked under (tracking it first, if asked)."""
    try:
        tracked: str | None = recorder.get_name_of_module(model)
    except RecordingError:
        tracked = None
    if tracked is not None:
        if name is not None and name != tracked:
            raise ConfigError(f"name={name!r}, but the model is tracked as {tracked!r} (track_module); leave name "
                              f"out, or pass name={tracked!r}.")
        return tracked
    resolved = "model" if name is None else name
    if not isinstance(resolved, str) or not resolved or any(c in resolved for c in ".*[]@"):
        raise ConfigError(f"name={name!r} must be a non-empty string without '.', '*', '[', ']' or '@', e.g. 'gpt'.")
    if track_parameters and recorder.comgra_is_active:
        if recorder.current_stage != "inactive":
            raise RecordingError(f"comgra.watch(model) was called inside training step {recorder.training_step}, and "
                                 "the model's parameters are not tracked yet; call it before the first start_batch(), "
                                 "or pass track_parameters=False.")
        recorder.track_module(resolved, model)
    return resolved


def _tensor_name(name: str, path: str) -> str:
    return f"{name}.{path}" if path else name


def _innermost(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside its wrappers (``torch.compile(DDP(model))`` too)."""
    inner = _unwrapped(model)
    return model if inner is model else _innermost(inner)


def _holds_no_tensor_by_design(output: Any) -> bool:
    """Outputs with nothing to record that need no warning: None, plain values, containers (of anything)."""
    return output is None or isinstance(output, (bool, int, float, complex, str, bytes, Mapping, tuple, list)) or \
        (dataclasses.is_dataclass(output) and not isinstance(output, type))


def _tensors_of(output: Any, key: str, depth: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(key suffix, tensor) for each tensor in a module's output: a tensor, or tuples, lists, mappings and
    dataclasses of them."""
    if isinstance(output, torch.Tensor):
        yield key, output
    elif depth >= _MAX_NESTING:
        return
    elif dataclasses.is_dataclass(output) and not isinstance(output, type) and not isinstance(output, Mapping):
        for field in dataclasses.fields(output):
            yield from _tensors_of(getattr(output, field.name, None), f"{key}[{field.name}]", depth + 1)
    elif isinstance(output, Mapping):  # dicts, and transformers' ModelOutput (an OrderedDict without None values)
        for item_key, value in output.items():
            yield from _tensors_of(value, f"{key}[{str(item_key).replace('*', '_')}]", depth + 1)
    elif isinstance(output, (tuple, list)):
        for index, value in enumerate(output):
            yield from _tensors_of(value, f"{key}[{index}]", depth + 1)

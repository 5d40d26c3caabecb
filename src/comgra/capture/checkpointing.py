"""Activation checkpointing (``torch.utils.checkpoint``): a checkpointed function runs twice, once in the forward
pass and again when the backward pass needs its activations, and a ``register_tensor`` inside it is called twice.

The forward value is the one recorded; the second call is recognised (``recomputing``) and never registers again:

* ``use_reentrant=False`` (and ``checkpoint_sequential`` with it): the forward pass builds the ordinary autograd
  graph, so the gradient hooks on the forward tensors fire and the dependency graph is the uncheckpointed one. The
  recomputation, run from a saved tensor's unpack hook in the backward pass, is simply ignored.
* ``use_reentrant=True`` (torch's ``CheckpointFunction``): the forward pass runs the function under ``no_grad``, so a
  tensor made inside it has no autograd node and gets no gradient. Its registration waits (``Region``) for the
  recomputation, which runs with gradients inside the backward of the checkpoint's own autograd node: the gradient
  hook goes on the recomputed tensor (its gradient is the one of the uncheckpointed run), and the dependency graph
  is walked through the recomputed autograd graph, joined to the outside where torch joins it: the function's
  detached inputs lead to the original inputs, and the checkpoint's node leads to the recomputed outputs.

Costs nothing on a step that does not record, and two C calls per registration on one that does, plus a walk up the
Python stack for a registration under ``no_grad`` (the reentrant forward pass, or an evaluation step).
"""
from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.checkpoint import CheckpointFunction

if TYPE_CHECKING:
    from comgra.capture.graph import Connections
    from comgra.capture.registry import Registration
# ``step`` below is a capture.step.StepRecording (which imports this module): its registrations, connections,
# gradient hooks and the tensors it keeps alive until the step ends.
StepRecording = Any

_FORWARD = CheckpointFunction.forward.__code__
_NODE = CheckpointFunction._backward_cls  # the autograd node of a reentrant checkpoint: its ctx in the forward pass
_BACKWARD = CheckpointFunction.backward.__code__
# The saved-tensor hook that non-reentrant checkpoint pushes while it recomputes (torch/utils/checkpoint.py).
_RECOMPUTATION_HOOK = "_recomputation_hook."
_current_graph_task_id = torch._C._current_graph_task_id
_current_autograd_node = torch._C._current_autograd_node


def _top_of_saved_tensor_hooks() -> Callable[[], Any]:
    """A function that returns (pack, unpack) on top of the saved-tensor hooks' stack, or None (torch 2.1's
    takes no argument; later ones ``ignore_is_tracing``)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return lambda: None
    try:
        top(True)
    except TypeError:
        return top  # type: ignore[no-any-return]
    return functools.partial(top, True)


_top_saved_tensor_hooks = _top_of_saved_tensor_hooks()


def recomputing() -> bool:
    """Whether a registration made now is a recomputation of the forward pass rather than the forward pass: autograd's
    engine runs a backward pass in this thread (both kinds of checkpoint recompute there), or non-reentrant
    checkpoint recomputes outside one (a saved tensor unpacked by hand)."""
    if _current_graph_task_id() != -1:
        return True
    hooks = _top_saved_tensor_hooks()
    return hooks is not None and getattr(hooks[0], "__qualname__", "").startswith(_RECOMPUTATION_HOOK)


def _frame_of(code: Any) -> FrameType | None:
    """The innermost frame on this thread's stack that runs ``code``."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return frame


@dataclass
class Region:
    """One call of a reentrant checkpoint: its autograd node, and what was registered inside it under ``no_grad``."""

    node: Any  # the checkpoint's autograd node (CheckpointFunctionBackward), the ctx of its forward
    arguments: tuple[Any, ...]
    waiting: dict[str, tuple[int, str]] = field(default_factory=dict)  # name -> registration key
    order: list[str] = field(default_factory=list)  # every name registered in the forward pass, in order
    task: int = -2  # the backward pass (graph task) whose recomputation was joined to the graph last
    count: int = 0  # registrations made by that recomputation so far
    frame: FrameType | None = None  # CheckpointFunction.backward's, until its recomputed outputs are read

    def is_argument(self, tensor: torch.Tensor) -> bool:
        return any(argument is tensor for argument in self.arguments)

    def settle(self, connections: Connections, keep_alive: list[torch.Tensor]) -> None:
        """Walk the checkpoint's node through the recomputed outputs (read once, then the frame is let go): what
        consumes the checkpoint's output then depends on what the output is made of inside the function."""
        frame, self.frame = self.frame, None
        if frame is None:
            return
        outputs = frame.f_locals.get("outputs")
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else outputs
        if not isinstance(outputs, tuple):  # the recomputation did not finish, or torch changed: torch's own edges stay
            return
        children: list[Any] = []
        for output in outputs:
            if isinstance(output, torch.Tensor) and output.requires_grad:
                if output.grad_fn is not None:  # the node only: the output's memory is freed as without comgra
                    children.append(output.grad_fn)
                else:  # a leaf (the function returned its input): the walk finds it by id
                    children.append(output)
                    keep_alive.append(output)
        connections.instead_of[self.node] = children


@dataclass
class Checkpoints:
    """The reentrant checkpoints of one recorded step whose registrations wait for their recomputation."""

    regions: dict[Any, Region] = field(default_factory=dict)  # by autograd node
    _inside: dict[int, tuple[tuple[int, str], Region]] = field(default_factory=dict)  # id(forward tensor) ->
    _unsettled: list[Region] = field(default_factory=list)  # recomputed, outputs not read yet
    # name -> key of every waiting registration: a checkpoint nested in a reentrant one is a new autograd node in
    # each recomputation of the outer one, and only the innermost recomputation has the gradient
    _waiting: dict[str, tuple[int, str]] = field(default_factory=dict)
    # name -> key of what was registered under no_grad outside torch's reentrant checkpoint, with no gradient: a
    # checkpoint of another library (DeepSpeed's, FairScale's, a custom autograd.Function) recomputes the same way
    _without_grad: dict[str, tuple[int, str]] = field(default_factory=dict)

    def made_without_grad(self, registration: Registration) -> None:
        self._without_grad[registration.tensor_name] = registration.key

    def reentrant_forward(self, tensor_name: str) -> Region | None:
        """The reentrant checkpoint whose forward pass registers ``tensor_name`` now (call only under ``no_grad``)."""
        frame = _frame_of(_FORWARD)
        if frame is None:
            return None
        local = frame.f_locals
        node = local.get("ctx")
        region = self.regions.get(node)
        if region is None:
            region = self.regions[node] = Region(node, tuple(local.get("args", ())))
        region.order.append(tensor_name)
        return region

    def wait(self, region: Region, registration: Registration, tensor: torch.Tensor) -> None:
        region.waiting[registration.tensor_name] = registration.key
        self._waiting[registration.tensor_name] = registration.key
        self._inside[id(tensor)] = (registration.key, region)

    def registered_inside(self, tensor: torch.Tensor) -> tuple[int, str] | None:
        """The key of ``tensor`` where it was registered inside a reentrant checkpoint and is now its output (the
        checkpoint's node is its autograd node): the same tensor under a second name."""
        inside = self._inside.get(id(tensor))
        return inside[0] if inside is not None and inside[1].node is tensor.grad_fn else None

    def settle(self, step: StepRecording) -> None:
        """Read the outputs of the recomputations done so far (their frames are let go)."""
        regions, self._unsettled = self._unsettled, []
        for region in regions:
            region.settle(step.connections, step.keep_alive)

    def unseen(self, memo: dict[Any, Any], connections: Connections) -> bool:
        """Whether the graph walk (``memo``: the nodes it visited) met a reentrant checkpoint it could not walk through:
        one that registered nothing inside, or was recomputed after the walk."""
        return any(type(node) is _NODE and node not in connections.instead_of for node in memo)

    def clear(self) -> None:
        for region in self.regions.values():
            region.frame = None
        self.regions.clear()
        self._unsettled.clear()
        self._waiting.clear()
        self._without_grad.clear()
        self._inside.clear()

    # -- the recomputation ---------------------------------------------------------------------------------------
    def recomputed(self, step: StepRecording, tensor_name: str, tensor: torch.Tensor, takeover: bool = False) -> None:
        """``register_tensor`` called again by a recomputation: the gradient of a tensor that waits for it is caught
        on the recomputed tensor, and the graph is walked through it; anything else was recorded in the forward
        pass already. ``takeover``: as in ``StepRecording.register`` (comgra.watch's module outputs)."""
        node = _current_autograd_node()
        if type(node) is not _NODE:  # non-reentrant: the forward tensor has the gradient and the graph
            key = self._without_grad.get(tensor_name) if tensor.grad_fn is not None else None
            if key is not None:  # another library's reentrant checkpoint: the gradient, not the graph
                if step.report is not None:
                    step.report(f"foreign-checkpoint:{tensor_name}", _foreign(tensor_name, type(node).__name__))
                return self._catch(step, key, tensor, takeover)
            if not {tensor_name, _base(tensor_name)} & step.latest_by_name.keys() and step.report is not None:
                step.report(f"backward-registration:{tensor_name}", _unknown_in_backward(tensor_name, step))
            return
        region = self.regions.get(node)
        if region is None:  # nothing inside waits; the graph still goes through the recomputation (parameters)
            region = self.regions[node] = Region(node, ())
        task = _current_graph_task_id()
        if region.task != task:  # this backward pass's recomputation (retain_graph: a second one makes new tensors)
            self.settle(step)  # the recomputations before this one are over
            region.task, region.count = task, 0
            self._wire(region, step)
            self._unsettled.append(region)
        position, region.count = region.count, region.count + 1
        if (tensor_name not in region.order and position < len(region.order)
                and _base(region.order[position]) == _base(tensor_name)):
            tensor_name = region.order[position]  # comgra.watch counts a module's second call as name@2
        key = region.waiting.get(tensor_name)
        if key is None and tensor.grad_fn is not None:  # made inside a nested checkpoint (see _waiting); not a leaf:
            key = self._waiting.get(tensor_name)  # that is a nested recomputation's detached input (counted twice)
        if key is None:  # its gradient reaches the forward tensor (the function's input), or it has none here
            return
        if len(step.graph_documents) > key[0] >= 0 and step.report is not None:
            step.report(f"reentrant-after-graph:{tensor_name}", _late_recomputation(tensor_name, key[0]))
        self._catch(step, key, tensor, takeover)

    def _catch(self, step: StepRecording, key: tuple[int, str], tensor: torch.Tensor, takeover: bool) -> None:
        """The recomputed ``tensor`` stands for the registration ``key`` from now on: in the graph walk, and its
        gradient is the registration's."""
        registration = step.registrations[key]
        if registration.tensor is not None:
            step.keep_alive.append(registration.tensor)  # its id stays in the step's maps
        registration.tensor, registration.grad_fn = tensor, tensor.grad_fn
        connections = step.connections
        if tensor.grad_fn is not None:
            owner = connections.by_grad_fn.get(tensor.grad_fn, key)
            if owner == key or takeover:
                connections.by_grad_fn[tensor.grad_fn] = key
            registration.same_as = owner if owner != key else None
        else:
            connections.by_leaf.setdefault(id(tensor), key)
        if tensor.requires_grad:
            gradient = step._gradient_hook(key)

            def hook(grad: torch.Tensor | None) -> None:
                self.settle(step)  # this recomputation is over: its outputs are known
                gradient(grad)
            step._hooks.append(tensor.register_hook(hook))

    def _wire(self, region: Region, step: StepRecording) -> None:
        """Join each detached input of the recomputation (a leaf of the recomputed graph) to the original input."""
        region.frame = frame = _frame_of(_BACKWARD)
        if frame is None:
            return
        local = frame.f_locals
        originals, detached = local.get("inputs", ()), local.get("detached_inputs", ())
        for original, copy in zip(originals, detached):
            if isinstance(copy, torch.Tensor) and copy.requires_grad and isinstance(original, torch.Tensor):
                step.connections.extra_by_leaf.setdefault(id(copy), []).append(original)
                step.keep_alive += [copy, original]


def _base(tensor_name: str) -> str:
    """``tensor_name`` without comgra.watch's count of a module's calls (``block@2``, ``block@2[0]``)."""
    return re.sub(r"@\d+(?=\[|$)", "", tensor_name)


def _foreign(tensor_name: str, node: str) -> str:
    return (f"Tensor {tensor_name!r} was registered without a gradient in the forward pass and again in the backward "
            f"pass (in {node}): a checkpoint other than torch.utils.checkpoint recomputes it (DeepSpeed's, FairScale's, "
            "a custom autograd.Function). Its gradient is taken from the recomputation; the dependency graph has no "
            "edges through that checkpoint. torch.utils.checkpoint.checkpoint(..., use_reentrant=False) gives the full "
            "graph. This warning is given once per tensor name.")


def _unknown_in_backward(tensor_name: str, step: StepRecording) -> str:
    return (f"register_tensor({tensor_name!r}) was called while autograd runs a backward pass, and no tensor of that "
            f"name was registered in the forward pass of training step {step.training_step}: it is not recorded. A "
            "checkpointed function (torch.utils.checkpoint) that registers a tensor is recognised when the backward "
            "pass recomputes it, as long as the forward pass registered the same name; register tensors in the "
            "forward pass. This warning is given once per tensor name.")


def _late_recomputation(tensor_name: str, iteration: int) -> str:
    return (f"Tensor {tensor_name!r} is registered inside a function checkpointed with torch.utils.checkpoint("
            f"use_reentrant=True), whose forward pass makes no autograd graph; the backward pass recomputed it after "
            f"finish_iteration() of iteration {iteration} had drawn the dependency graph, so that graph has no edges "
            "through the checkpointed function (its values and gradients are recorded). Call loss.backward() before "
            "finish_iteration(), or checkpoint with use_reentrant=False. This warning is given once per tensor name.")


UNSEEN = ("A function checkpointed with torch.utils.checkpoint(use_reentrant=True) runs its forward pass without an "
          "autograd graph, and the dependency graph could not be walked through its recomputation: it registers no "
          "tensor, or the backward pass came after finish_iteration(). What is inside it (its parameters, its "
          "tensors) has no edges there; the values and gradients are recorded. Checkpoint with use_reentrant=False, "
          "or register a tensor inside the function and call loss.backward() before finish_iteration().")

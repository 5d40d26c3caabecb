"""The recorder and torch.compile: recorded steps run eagerly, the others run the compiled code untouched.

A step that records (or on which a breakpoint watches tensors) sets TorchDynamo's stance to
``"force_eager"`` from ``start_batch`` to the end of the step (``finish_batch``, ``finalize``, or a
fault of comgra's): every ``torch.compile``d model or function then runs its plain Python, so the
recorded values, gradients and dependency graph are those of the eager model, comgra sees real
tensors, and nothing is traced or compiled. On the other steps comgra's calls inside a compiled
forward trace to nothing (the recorder checks ``is_compiling()`` first and returns): no graph break,
no guard that differs between steps, no recompilation per tensor name. Switching the stance compiles
nothing and invalidates no compiled code.

The stance is switched only where ``torch._dynamo`` is imported already (``torch.compile`` imports it):
an eager user pays nothing, not even the import (about a second).

A call that is traced on a step that takes tensors anyway (a model compiled after ``start_batch``, a
stance the user set inside the step) leaves the traced frame through ``torch.compiler.disable``
(``untraced``): the graph breaks there, and comgra records the real tensors, as before this design.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["EagerSteps", "is_compiling", "untraced"]

# True while TorchDynamo traces (a constant in the traced code), False otherwise: a function that returns False,
# 0.03 us a call (torch.compiler.is_compiling, which also asks TorchScript, 0.07 us).
is_compiling = torch.compiler.is_dynamo_compiling

# Functions wrapped in torch.compiler.disable, made when first wanted (see untraced).
_UNTRACED: dict[Callable[..., Any], Callable[..., Any]] = {}
_NOT_SET = object()
prepared = False  # the wrappers are made (see prepare); read by the recorder at every start_batch


def untraced(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` run outside any graph TorchDynamo traces: called from a compiled frame, Dynamo stops its graph
    there and runs comgra eagerly on the real tensors. Inside the trace comgra would see fake tensors (its C
    kernel read them as memory: SIGSEGV), guard and recompile on its own state. Importing torch._dynamo costs
    about a second, so the wrappers are made only where it is imported already (``prepare``), or in the trace."""
    wrapper = _UNTRACED.get(method)
    if wrapper is None:
        wrapper = _UNTRACED[method] = torch.compiler.disable(method, recursive=True)
    return wrapper


def prepare(methods: Callable[[], list[Callable[..., Any]]]) -> None:
    """Make the wrappers of ``methods()`` while no trace runs, once torch.compile was imported (so that a trace
    does not stop a second time to make them)."""
    global prepared
    if not prepared and "torch._dynamo" in sys.modules:
        for method in methods():
            untraced(method)
        prepared = True


class EagerSteps:
    """The "force_eager" stance of one recorder's steps: ``enter()`` at the start of a step that takes tensors,
    ``leave()`` on every path that ends it. ``active``: the stance is ours now."""

    __slots__ = ("_prior",)

    def __init__(self) -> None:
        self._prior: Any = _NOT_SET

    @property
    def active(self) -> bool:
        return self._prior is not _NOT_SET

    def enter(self) -> None:
        """Run every compiled model and function eagerly until ``leave()`` (where torch.compile is in use)."""
        if self._prior is not _NOT_SET or "torch._dynamo" not in sys.modules:
            return
        try:
            from torch._dynamo import eval_frame  # torch's own stance, read and set (set_stance hides the prior one)

            self._prior = eval_frame._set_stance(eval_frame.DynamoStance("force_eager"))
        except RuntimeError:  # called inside a compiled region (a compiled training step): the calls break the graph
            pass
        except Exception:  # noqa: BLE001 - a torch without this internal API: comgra's calls break the graph instead
            pass

    def leave(self) -> None:
        """The stance of before ``enter()`` again; nothing where ``enter()`` did not set one."""
        if self._prior is _NOT_SET:
            return
        try:
            from torch._dynamo import eval_frame

            eval_frame._set_stance(self._prior)
        except RuntimeError:  # inside a compiled region: the next leave() (finish_batch, finalize) restores it
            return
        except Exception:  # noqa: BLE001 - never the training's fault; nothing more to restore
            pass
        self._prior = _NOT_SET

"""Class-level ``forward`` wrappers: a module call measured without forward hooks.

Forward hooks send every call of a hooked module down ``nn.Module``'s slow path (about as costly as
a small layer's own work). Instead, while a profiler is active, the class of each profiled module
gets a ``forward`` of ours, set on that exact class, that finds the instance's handler by
``id(instance)`` and otherwise calls the class's own forward straight through. Nothing is stored on
the instances: ``copy.deepcopy``, pickle, ``torch.save`` and ``state_dict`` see plain modules, and
``nn.Module.__call__`` keeps its fast path. The profiler holds strong references to the modules it
registers, so an id cannot be reused by another object while it is registered.

A handler acts only when ``type(instance) is`` the patched class, so a subclass whose forward calls
``super().forward()`` goes through the base class's wrapper without being counted twice. The
classes are restored exactly when their last registered instance is released (several profilers may
share a class). ``attach`` answers False where a wrapper cannot be used (TorchScript, an instance
with its own ``forward`` attribute, a forward that is not a plain function): the caller then uses
hooks.
"""
from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch

# handler(module, forward, args, kwargs) -> output; it must call forward(module, *args, **kwargs) once. Calls made
# while TorchDynamo traces (torch.compile) go straight to the forward: there are no module calls to measure then,
# and a handler read there would put guards on its state into the compiled code.
Handler = Callable[[torch.nn.Module, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]


class _ClassPatch:
    __slots__ = ("cls", "own", "wrapper", "handlers")

    def __init__(self, cls: type, own: Any):
        self.cls = cls
        self.own = own  # the forward defined in the class's own __dict__, or None where it inherits one
        self.handlers: dict[int, Handler] = {}
        self.wrapper = _make_wrapper(cls, own, self.handlers)


_PATCHES: dict[type, _ClassPatch] = {}
_is_compiling = torch.compiler.is_compiling  # True while TorchDynamo traces; a constant in the traced code


def attach(module: torch.nn.Module, handler: Handler) -> bool:
    """Route the calls of ``module``'s forward through ``handler``; False where that cannot be done here
    (the caller falls back to hooks). The caller must keep ``module`` alive until ``detach``."""
    cls = type(module)
    if isinstance(module, torch.jit.ScriptModule) or "forward" in vars(module):
        return False
    patch = _PATCHES.get(cls)
    if patch is None:
        own = vars(cls).get("forward")
        inherited = getattr(cls, "forward", None)
        if not isinstance(own if own is not None else inherited, types.FunctionType):
            return False  # a staticmethod, a C function, a descriptor: not ours to wrap
        patch = _ClassPatch(cls, own)
        try:
            setattr(cls, "forward", patch.wrapper)
        except (TypeError, AttributeError):
            return False  # a class that refuses new attributes
        _PATCHES[cls] = patch
    if id(module) in patch.handlers:
        return False  # another profiler has it: this one uses hooks
    patch.handlers[id(module)] = handler
    return True


def replace(module: torch.nn.Module, handler: Handler) -> None:
    """Route ``module``'s calls through ``handler`` from now on, instead of the one it was attached with."""
    patch = _PATCHES.get(type(module))
    if patch is not None and id(module) in patch.handlers:
        patch.handlers[id(module)] = handler


def detach(module: torch.nn.Module) -> None:
    """Stop routing ``module``'s calls; the last instance of a class restores the class exactly."""
    cls = type(module)
    patch = _PATCHES.get(cls)
    if patch is None or patch.handlers.pop(id(module), None) is None or patch.handlers:
        return
    del _PATCHES[cls]
    if vars(cls).get("forward") is not patch.wrapper:
        return  # someone replaced our wrapper since: theirs stays (ours now passes everything through)
    if patch.own is not None:
        setattr(cls, "forward", patch.own)
    else:
        delattr(cls, "forward")


def attached(cls: type) -> bool:
    """Whether ``cls`` carries a wrapper of ours now (for tests and diagnostics)."""
    return cls in _PATCHES


def _make_wrapper(cls: Any, own: Any, handlers: dict[int, Handler]) -> Callable[..., Any]:
    if own is not None:
        forward = own
    else:
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            return super(cls, self).forward(*args, **kwargs)  # resolved per call: a base may be patched later

    def wrapped_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        kind: Any = type(self)
        if kind is cls and not _is_compiling():  # first: under TorchDynamo no handler, nor a guard on one
            handler = handlers.get(id(self))
            if handler is not None:
                return handler(self, forward, args, kwargs)
        return forward(self, *args, **kwargs)

    # Keeps the name, docstring and signature (inspect.signature follows __wrapped__; transformers reads it).
    return functools.wraps(own if own is not None else getattr(cls, "forward"))(wrapped_forward)

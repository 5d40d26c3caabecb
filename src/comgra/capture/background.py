"""Statistics of the parameters on a worker thread, while the forward and backward passes go on.

On the CPU the statistics of the parameters (at the first ``start_iteration``) are bandwidth-bound
passes over every parameter value, plus the spectral norms: tens of milliseconds on ResNet-18 and
nanoGPT. They are handed to one worker thread, which runs them on a core that the training leaves
idle (torch kernels release the GIL), and the step waits for them only where the values could
change: before any optimizer's ``step()`` (a global step pre-hook), at the end of the backward pass (a
manual update needs the gradients), and at the next recorder call that needs them. (The parameters'
gradients are summarised synchronously at ``record_current_gradients``: the user holds them, and a
second backward pass, ``clip_grad_norm_`` or a ``.data`` edit changes them in place with no hook that
could wait.)

Each job remembers the version counters of its tensors. If one changed before the job was waited for
(an in-place op the hooks cannot see), the job is computed again on the caller's thread, so the
result is never a mix of old and new values; that value is then the one at the wait, not at the
call. On a GPU nothing is handed over: kernels are queued asynchronously anyway.
"""
from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Any, Callable

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

_EXECUTOR: concurrent.futures.ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


_EXECUTOR_PID = 0


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    """One worker per process; a forked child (a DataLoader worker, multiprocessing) gets its own: the
    parent's thread does not exist there, and jobs handed to its executor would never run."""
    global _EXECUTOR, _EXECUTOR_PID
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None or _EXECUTOR_PID != os.getpid():
            _EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="comgra-statistics")
            _EXECUTOR_PID = os.getpid()
        return _EXECUTOR


def worth_a_thread(tensors: list[torch.Tensor]) -> bool:
    """CPU tensors only: on a GPU the kernels are asynchronous already."""
    return bool(tensors) and all(t.device.type == "cpu" for t in tensors)


class Job:
    """``compute(items)`` running on the worker; ``result()`` returns what it returned."""

    def __init__(self, compute: Callable[[Any], Any], items: list[tuple[Any, torch.Tensor]]) -> None:
        self._compute = compute
        self._items = items
        self._versions = [tensor._version for _, tensor in items]
        self._changed: bool | None = None
        self._hooks: list[Any] = []
        self._future = _executor().submit(compute, items)

    def guard_against_optimizers(self) -> None:
        """Wait before any optimizer's step() changes the tensors in place."""
        self._hooks.append(register_optimizer_step_pre_hook(lambda *_: self.wait()))

    def wait(self) -> None:
        """Wait for the worker (never raises: called from hooks inside the user's training) and note
        whether a tensor changed in place while it ran."""
        concurrent.futures.wait([self._future])
        if self._changed is None:
            self._changed = [tensor._version for _, tensor in self._items] != self._versions

    def result(self) -> Any:
        self.wait()
        self.close()
        if self._changed:
            return self._compute(self._items)
        return self._future.result()

    def close(self) -> None:
        """Remove the optimizer hook (not from inside it: torch iterates over the hooks)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()


def wait_at_end_of_backward(job: Job) -> None:
    """From inside a gradient hook: wait for ``job`` once the current backward pass is over, before a
    manual parameter update (``p.data -= lr * p.grad``, which no version counter sees) can run."""
    try:
        torch.autograd.Variable._execution_engine.queue_callback(job.wait)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # not inside a backward pass, or a torch without it
        job.wait()

"""Statistics of the parameters on a worker thread, while the forward and backward passes go on.

On the CPU the statistics of the parameters (at the first ``start_iteration``) are bandwidth-bound
passes over every parameter value, plus the spectral norms: tens of milliseconds on ResNet-18 and
nanoGPT. They are handed to one worker thread, which runs them on a core that the training leaves
idle (torch kernels release the GIL), and the step waits for them only where the values could
change: before any optimizer's ``step()`` (a global step pre-hook), at the end of the backward pass (a
manual update needs the gradients), and at the next recorder call that needs them. (The gradients
are summarised synchronously: a second backward pass accumulates into ``.grad`` in place, and no hook
runs before it that could wait.)

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


class GradientPrefetch:
    """The statistics of one parameter's gradient, started on the worker the moment the backward pass
    has accumulated it (``register_post_accumulate_grad_hook``): they overlap the rest of the backward
    pass and the optimizer step instead of waiting for ``record_current_gradients``.

    The gradient must be the same at ``record_current_gradients`` as when the worker read it; nothing
    guarantees that (``clip_grad_norm_``, ``p.grad.data.clamp_(-1, 1)``, a second backward pass), and
    ``.data`` edits do not move the version counter. So the worker takes a checksum of the raw bits
    before and after its pass, and the result is used only if the gradient at the call has the same
    checksum (one integer sum, a fifth of the work of the statistics); otherwise the caller computes it
    anew, from the values at the call."""

    def __init__(self, compute: Callable[[Any], Any], item: tuple[Any, torch.Tensor]) -> None:
        self.gradient = item[1]
        self._future = _executor().submit(self._run, compute, item)

    @staticmethod
    def _run(compute: Callable[[Any], Any], item: tuple[Any, torch.Tensor]) -> tuple[Any, int | None]:
        before = checksum(item[1])
        result = compute([item])
        return result, (before if checksum(item[1]) == before else None)

    def result_if_unchanged(self, gradient: torch.Tensor) -> Any | None:
        """What the worker computed, or None where ``gradient`` is not exactly what it read."""
        if gradient is not self.gradient:
            return None
        concurrent.futures.wait([self._future])
        if self._future.exception() is not None:
            return None  # computed again on the caller's thread, where an error is reported as usual
        result, before = self._future.result()
        return result if before is not None and checksum(gradient) == before else None


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def checksum(tensor: torch.Tensor) -> int:
    """The sum of the raw bits as integers, wrapping around in their own width: exact, so independent
    of the order of summation (widening to int64 first is 70x slower: not vectorised)."""
    bits = _BITS[tensor.element_size()]
    return int(tensor.detach().view(bits).sum(dtype=bits))

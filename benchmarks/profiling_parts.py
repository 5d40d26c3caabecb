"""Where per-layer profiling's cost goes on the tutorial model: the profiler taken apart, side by side in one run.

Each variant is the tutorial workload of ``benchmarks/profiling.py`` with profiling on, with the module
handler (what the class-level forward wrapper calls for each module call) replaced by a part of it:

  off        profiling off (comgra recording, modules tracked)
  wrap       the forward wrappers installed, the handler only calls the forward
  time       + a record per call with two clock reads, into the step's records (the step's end and the rows
             at flush run on them: no backward marks)
  mark       + the backward marker on the output (the full lean path without the tracing checks and bytes):
             the C++ marker of ``comgra.profiling.native_marker``
  mark/py    the same with the Python hook as the marker (what every step used before the C++ marker)
  full       the profiler as it is (the C++ marker, and the C++ handler measuring each call)
  full/pycall  the profiler as it is with the Python handler measuring each call (what ``full`` was before the
             C++ handler, and what it is until the C++ marker is built)
  full/py    the profiler as it is with the Python hook as the marker (and so the Python handler)
  full/drop  the profiler as it is, the step's records dropped at its end (per-call cost only)

The variants alternate step by step; each step's CPU time of the training thread is kept by batch (the
workload cycles through 16 batches of different sequence lengths). Figures: per batch the minimum (the step
least disturbed by other jobs on a shared machine), the median and the mean, summed over the 16 batches, as
ratios to ``off``. ``--no-gc`` switches the cyclic garbage collector off while measuring.

    python benchmarks/profiling_parts.py [--steps 800] [--no-gc]
"""
from __future__ import annotations

import argparse
import collections
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from profiling import tutorial_workload  # noqa: E402

from comgra.profiling import native_marker  # noqa: E402
from comgra.profiling.layer_calls import FORWARD_END, SUBTREE_END, CallMarks, Layer  # noqa: E402

FULL_HANDLER = CallMarks.forward_handler
WARM_UP, BATCHES = 20, 16  # the workload cycles through 16 batches


def _wrap_only(marks: CallMarks, layer: Layer) -> Any:
    def handler(module: Any, forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return forward(module, *args, **kwargs)
    return handler


def _timing(marks: CallMarks, layer: Layer, *, mark: bool = False) -> Any:
    def handler(module: Any, forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        records = marks.records
        if records is None:
            return forward(module, *args, **kwargs)
        clock = marks.clock
        record = [layer, clock(), None, 0, None, None, None, None]
        records.append(record)
        output = forward(module, *args, **kwargs)
        record[FORWARD_END], record[SUBTREE_END] = clock(), len(records)
        if mark and type(output) is torch.Tensor:
            if marks.native_step:  # as the profiler's lean path does
                marks.native_mark(output, record)  # type: ignore[misc]
            elif output.grad_fn is not None:
                marks.mark_backward_start(output, output.grad_fn, record)
        return output
    return handler


def _marking(marks: CallMarks, layer: Layer) -> Any:
    return _timing(marks, layer, mark=True)


HANDLERS: dict[str, Any] = {  # "/py": the same handler, with the Python hook as the marker (see _make)
    "off": None, "wrap": _wrap_only, "time": _timing, "mark": _marking, "mark/py": _marking,
    "full": FULL_HANDLER, "full/pycall": FULL_HANDLER, "full/py": FULL_HANDLER, "full/drop": FULL_HANDLER}
LEAN = ("full", "full/drop")  # the variants whose plain calls the C++ handler measures (the others' handlers are theirs)


def _make(root: Path, variant: str) -> Callable[[int], None]:
    handler = HANDLERS[variant]
    CallMarks.forward_handler = handler if handler is not None else FULL_HANDLER  # type: ignore[method-assign]
    CallMarks.lean_default = variant in LEAN
    try:
        folder = root / variant.replace("/", "-")
        folder.mkdir()
        step = tutorial_workload(folder, "off" if variant == "off" else "on")
    finally:
        CallMarks.forward_handler = FULL_HANDLER  # type: ignore[method-assign]
        CallMarks.lean_default = True
    if variant != "off":
        step.recorder.instruments.profiler._marks.native_allowed = not variant.endswith("/py")  # type: ignore[attr-defined]
    if variant == "full/drop":
        marks = step.recorder.instruments.profiler._marks  # type: ignore[attr-defined]
        close = marks.close

        def close_and_drop() -> tuple[None, list[Any]]:
            close()
            return None, []
        marks.close = close_and_drop  # type: ignore[method-assign]
    return step


def measure(steps: int, root: Path) -> dict[str, dict[int, list[float]]]:
    """Seconds of the training thread's CPU per step, by batch (same sequence length), the variants alternating
    step by step: a disturbance of a shared machine hits neighbouring steps of all variants alike."""
    runs = {variant: _make(root, variant) for variant in HANDLERS}
    for run in runs.values():
        for index in range(WARM_UP):
            run(index)
    seconds: dict[str, dict[int, list[float]]] = {variant: collections.defaultdict(list) for variant in runs}
    for index in range(WARM_UP, WARM_UP + steps):
        for variant, run in runs.items():
            start = time.thread_time()
            run(index)
            seconds[variant][index % BATCHES].append(time.thread_time() - start)
    for run in runs.values():
        run.recorder.finalize()  # type: ignore[attr-defined]
    return seconds


def ratio(seconds: dict[str, dict[int, list[float]]], variant: str, statistic: Callable[[list[float]], float]) -> float:
    """The statistic per batch, summed over the batches (one pass over the data), as a ratio to ``off``."""
    def total(name: str) -> float:
        return sum(statistic(values) for values in seconds[name].values())
    return total(variant) / total("off")


def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--no-gc", action="store_true", help="the cyclic garbage collector off while measuring")
    args = parser.parse_args(arguments)
    torch.set_num_threads(1)
    if not native_marker.ensure_built():
        print("the C++ backward marker could not be built here: 'mark' and 'full' use the Python hook as well")
    if args.no_gc:
        gc.disable()
    with tempfile.TemporaryDirectory() as root:
        seconds = measure(args.steps, Path(root))
    off = sum(min(values) for values in seconds["off"].values()) / BATCHES
    print(f"tutorial, gc {'off' if args.no_gc else 'on'}, {args.steps} steps per variant alternating step by step; "
          f"'off' {off * 1e6:.0f} us per step (training thread CPU, per-batch minima); ratios to 'off':")
    for variant in HANDLERS:
        print(f"  {variant:10s} minima {ratio(seconds, variant, min):.3f}x  medians "
              f"{ratio(seconds, variant, statistics.median):.3f}x  means {ratio(seconds, variant, statistics.fmean):.3f}x")


if __name__ == "__main__":
    main()

"""An unrecorded step's cost on the tiny MLP (issue 34), timed where it is spent: comgra's own calls inside the
training loop, and the garbage collections they set off, for a reference commit and the current tree.

    python benchmarks/unrecorded_step.py --ref 467b072
    python benchmarks/unrecorded_step.py --ref main --steps 4000 --children 3

benchmarks/mlp_fixed_cost.py subtracts a plain block of steps from a recorded one: on a shared machine the spread
of the rounds is ten times the 0.05 ms asked of an unrecorded step. Here each of comgra's calls of the step
(start_batch, start_iteration, the registrations, record_current_gradients, finish_iteration, finish_batch) is
timed inside the training loop of the MLP 64-4x256-10 (batch 64; benchmarks/breakdown_workloads.py, no step
recorded) with ``time.perf_counter`` (the thread's CPU clock is a system call that costs microseconds itself),
less one read of the clock made right after each call; a step's figure is the sum of its calls, and the low
percentiles are the steps no other process interrupted. A recorder whose methods do nothing (the row "noop") measures 10-14 us a
step this way (calls from cold caches and the timing itself). What they cost the training's own code (the caches they
use) is not in it. The garbage collector's collections during the run are timed too (``gc.callbacks``): a full
collection of a process that imported torch takes tenths of a second, and what sets it off is the objects the
steps leave to it; its time is given per step. torch's global optimizer hook (called inside ``optimizer.step``)
is counted in the calls per step, not timed. Child processes alternate ref, now, ref, now ...; the table gives
per side the median over its children of the 10th percentile, the median and the mean of the steps, and per
call the median of the steps (the eight registrations of a step together).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent
_CALLS = ("start_batch", "start_iteration", "register_tensor", "record_current_gradients", "finish_iteration",
          "finish_batch")


class _Timed:
    """Stands for the recorder in the training loop: each call timed on the thread's CPU clock."""

    def __init__(self, recorder: Any) -> None:
        self.recorder, self.spent = recorder, 0.0
        self.by_call = dict.fromkeys(_CALLS, 0.0)  # seconds over the run, per API call
        clock = time.perf_counter
        for name in _CALLS:
            method = getattr(recorder, name)

            def timed(*args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> Any:
                start = clock()
                result = _method(*args, **kwargs)
                end = clock()
                spent = end - start - (clock() - end)  # less a read of the clock, in the same state of the caches
                self.spent += spent
                self.by_call[_name] += spent
                return result
            setattr(self, name, timed)


class _Nothing:
    """A recorder whose calls do nothing: what the timing itself and six calls from cold caches cost (the floor)."""

    def __getattr__(self, name: str) -> Any:
        return _nothing

    def track_module(self, *args: Any, **kwargs: Any) -> None:
        return None


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def child(steps: int, noop: bool = False) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    import breakdown_workloads as wl
    wl.setup_process()
    workload = wl.WORKLOADS["mlp"]
    collections: list[tuple[int, float]] = []

    def on_collection(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            on_collection.started = time.thread_time()  # type: ignore[attr-defined]
        else:
            spent = time.thread_time() - on_collection.started  # type: ignore[attr-defined]
            collections.append((info["generation"], spent))
    with tempfile.TemporaryDirectory() as folder:
        recorder = _Nothing() if noop else wl.make_recorder(Path(folder), "unrecorded", "never")
        timed = _Timed(recorder)
        trainer = wl.Trainer(workload, recorder)
        trainer.recorder = timed
        batches = [workload.batch(step) for step in range(16)]
        for step in range(200):  # warm-up
            trainer.step(batches[step % 16])
        per_step: list[float] = []
        per_call: dict[str, list[float]] = {name: [] for name in _CALLS}
        gc.callbacks.append(on_collection)
        try:
            for step in range(steps):
                timed.spent, timed.by_call = 0.0, dict.fromkeys(_CALLS, 0.0)
                trainer.step(batches[step % 16])
                per_step.append(timed.spent * 1e6)
                for name, seconds in timed.by_call.items():
                    per_call[name].append(seconds * 1e6)
        finally:
            gc.callbacks.remove(on_collection)
        by_call = {name: statistics.median(values) for name, values in per_call.items()}
        counts = _count_calls(trainer, batches)
        if not noop:
            recorder.finalize()
    import comgra
    return {"per_step_us": per_step, "collections": collections, "calls": counts,
            "by_call_us": by_call, "comgra_file": comgra.__file__}


def _count_calls(trainer: Any, batches: list[Any]) -> dict[str, float]:
    """comgra's Python functions and the C functions they call, per step, over 200 steps (sys.setprofile)."""
    found = {"python": 0, "c": 0}

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if "comgra" in frame.f_code.co_filename and event in ("call", "c_call"):
            found["python" if event == "call" else "c"] += 1
    sys.setprofile(profile)
    try:
        for step in range(200):
            trainer.step(batches[step % 16])
    finally:
        sys.setprofile(None)
    return {key: value / 200 for key, value in found.items()}


def _summary(result: dict[str, Any], steps: int) -> dict[str, float]:
    values = sorted(result["per_step_us"])
    full = [seconds for generation, seconds in result["collections"] if generation == 2]
    young = [seconds for generation, seconds in result["collections"] if generation < 2]
    return {"p10": statistics.quantiles(values, n=10)[0], "median": statistics.median(values),
            "mean": statistics.fmean(values), "gc_us_per_step": (sum(full) + sum(young)) / steps * 1e6,
            "full_collections": len(full), "young_collections": len(young),
            "python_calls": result["calls"]["python"], "c_calls": result["calls"]["c"],
            **{f"call:{name}": value for name, value in result["by_call_us"].items()}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", default="main~1", help="the reference commit (any git revision)")
    parser.add_argument("--steps", type=int, default=3000, help="timed unrecorded steps per child")
    parser.add_argument("--children", type=int, default=2, help="child processes per side")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--noop", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        print("RESULT " + json.dumps(child(options.steps, options.noop)))
        return
    print(f"reference {options.ref} against the current tree; load average before: {os.getloadavg()[0]:.2f}; "
          f"{options.children} children per side, {options.steps} unrecorded MLP steps each")
    found: dict[str, list[dict[str, float]]] = {"ref": [], "now": [], "noop": []}
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "reference"
        subprocess.run(["git", "-C", str(REPOSITORY), "worktree", "add", "--detach", str(target), options.ref],
                       check=True, capture_output=True, text=True)
        try:
            for _ in range(options.children):
                for side, source in (("ref", target), ("now", REPOSITORY), ("noop", REPOSITORY)):
                    process = subprocess.run(
                        [sys.executable, str(HERE / "unrecorded_step.py"), "--child", "--steps", str(options.steps)]
                        + (["--noop"] if side == "noop" else []),
                        env=dict(os.environ, PYTHONPATH=str(source / "src")), capture_output=True, text=True)
                    lines = [line for line in process.stdout.splitlines() if line.startswith("RESULT ")]
                    if process.returncode != 0 or not lines:
                        raise RuntimeError(f"{side} failed:\n{process.stdout[-2000:]}\n{process.stderr[-4000:]}")
                    found[side].append(_summary(json.loads(lines[-1][len("RESULT "):]), options.steps))
        finally:
            subprocess.run(["git", "-C", str(REPOSITORY), "worktree", "remove", "--force", str(target)],
                           capture_output=True, text=True)
    print("\ncomgra's calls of an unrecorded step, inside the training loop, us per step (median over the children)")
    print(f"  {'side':<5}{'10th pct':>10}{'median':>10}{'mean':>10}{'GC us/step':>12}{'full GCs':>10}{'young GCs':>11}"
          f"{'Py calls':>10}{'C calls':>9}")
    for side in ("ref", "now", "noop"):
        rows = found[side]

        def middle(key: str) -> float:
            return statistics.median(row[key] for row in rows)
        print(f"  {side:<5}{middle('p10'):>10.1f}{middle('median'):>10.1f}{middle('mean'):>10.1f}"
              f"{middle('gc_us_per_step'):>12.1f}{middle('full_collections'):>10.0f}"
              f"{middle('young_collections'):>11.0f}"
              f"{middle('python_calls'):>10.1f}{middle('c_calls'):>9.1f}")
    print("  per call, us per step (median of the steps; the 8 registrations together): " + "; ".join(
        f"{side} " + ", ".join(f"{name} {statistics.median(row['call:' + name] for row in found[side]):.1f}"
                               for name in _CALLS) for side in ("ref", "now")))
    print("  noop: a recorder whose calls do nothing, timed the same way (the floor: comgra's cost is the rest)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

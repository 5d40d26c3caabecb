"""Where does a long run's memory go? The long run's training loop (benchmarks/long_run.py) under controls.

Each mode runs in a fresh interpreter, one after the other, with the same step count and loop:

* ``torch``: no comgra at all (not even imported): what plain torch and Python do over the run;
* ``inactive``: comgra imported, the recorder built with ``comgra_is_active=False``, every call made;
* ``idle``: the recorder active, but nothing recorded after the first step and no KPI (its threads run:
  the writer, the resource sampler, the breakpoint poller);
* ``kpis``: a KPI on every step, nothing recorded after the first step;
* ``recording``: one step in ``--every`` recorded, no KPI;
* ``full``: both, as long_run.py does.

For each: the Theil-Sen slope (with its 95% interval) over the second half of RSS, RSS less the mapped
files, glibc's heap in use, the Arrow data the writer holds until its next write ("buffered"), Python's
allocated blocks (``sys.getallocatedblocks``), open files and threads; the slope net of the ``torch``
control; and the Python object types (``gc.get_objects``) whose count grew between the middle and the
end. ``--tracemalloc MODE`` also traces one mode's Python heap and prints the 20 tracebacks that grew
most between two steps (``--snapshots``). ``--max-flush-seconds`` and ``--max-buffered-bytes`` set the
writer's bounds (0: no bytes bound, the writer before it had one), to compare them side by side.

What it found (see the round's report for figures): plain torch is flat; glibc's heap grew with the
recorded tables the writer held until its next write, whose interval grows with the run's age (to 30 s
after eight minutes), hence ``ChunkWriter(max_buffered_bytes=...)``; Python's blocks grow about 9 per
second of the run with comgra's threads running, about 7 of them the resource sampler's in-memory
history (7.1 blocks a sample, one a second; bounded: its last 3,600 samples).

    nice -n 10 python benchmarks/long_run_controls.py --steps 200000 --parallel
    nice -n 10 python benchmarks/long_run_controls.py --steps 100000 --modes full --max-buffered-bytes 0
    nice -n 10 python benchmarks/long_run_controls.py --steps 300000 --modes full --tracemalloc full \\
        --snapshots 100000,300000
"""
from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable, NamedTuple

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_memory import anonymous_resident_mib, native_heap_mib, resident_mib  # noqa: E402

MODES = ("torch", "inactive", "idle", "kpis", "recording", "full")
FIGURES = ("rss", "anon", "malloc_used", "arrow", "buffered", "blocks", "fds", "threads")
UNITS = {"rss": "MiB", "anon": "MiB", "malloc_used": "MiB", "arrow": "MiB", "buffered": "MiB", "blocks": "blocks",
         "fds": "fds", "threads": "threads"}
NEVER = 10**12  # a recording gap no run reaches: the first step only is recorded


def sample(buffered: Any = None) -> dict[str, float]:
    process = psutil.Process()
    figures = {"rss": resident_mib(), "anon": anonymous_resident_mib(), **native_heap_mib(),
               "blocks": float(sys.getallocatedblocks()), "fds": float(process.num_fds()),
               "threads": float(threading.active_count())}
    if buffered is not None:
        figures["buffered"] = buffered()
    if "pyarrow" in sys.modules:  # what Arrow's default pool (ARROW_DEFAULT_MEMORY_POOL: mimalloc, jemalloc, system) holds
        figures["arrow"] = sys.modules["pyarrow"].default_memory_pool().bytes_allocated() / 2**20
    return figures


def writer_buffer_mib(recorder: Any) -> float:
    """MiB of Arrow tables the writer holds until its next flush (its buffer, and what waits in its queue),
    and the recorder's KPI points not yet handed to it (about 100 bytes each, rows of Python objects)."""
    writer = recorder.session.writer if recorder.session is not None else None
    if writer is None:
        return 0.0
    held = [table for tables in list(writer._buffer.tables.values()) for table in list(tables)]
    queued = [item[1][1] for item in list(writer._queue.queue) if item[0] == "table"]
    return (sum(t.nbytes for t in held + queued) + 100 * len(recorder._kpis.rows)) / 2**20


def object_counts() -> dict[str, int]:
    """Objects the garbage collector tracks (containers: no ints, floats or strings), by type name."""
    gc.collect()
    return dict(collections.Counter(type(o).__qualname__ for o in gc.get_objects()))


class Loop(NamedTuple):
    """One training step (``step(number)``), the call that ends the run, and the recorder (None without comgra)."""

    step: Callable[[int], None]
    finish: Callable[[], None]
    recorder: Any


def make_step(mode: str, root: Path, every: int, writer_options: dict[str, Any] | None = None) -> Loop:
    """The long run's training step (benchmarks/long_run.py runs ``make_step("full", ...)``) for ``mode``: the
    recorder's calls are left out where the mode says.

    Everything is built here, before the first step, in every mode: building the optimizer imports
    torch._dynamo (seconds), which must not fall inside a timed loop in one mode and outside in another."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, targets = torch.randn(64, 8, 8), torch.randn(64, 8, 1)
    if mode == "torch":
        def plain(step: int) -> None:
            x, y = inputs[step % 64], targets[step % 64]
            out = model(x)
            loss = (out - y).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return Loop(plain, lambda: None, None)

    from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
    from comgra.recorder import ComgraRecorder
    from comgra.store.writer import ChunkWriter

    # The writer's defaults, for this process only: the recorder does not pass these through.
    ChunkWriter.__init__.__kwdefaults__.update(writer_options or {})

    recorded = mode in ("recording", "full")
    recorder = ComgraRecorder(root, "long", "trial", DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=every if recorded else NEVER), comgra_is_active=mode != "inactive")
    recorder.track_module("model", model)
    with_kpis = mode in ("inactive", "kpis", "full")

    def recorded_step(step: int) -> None:
        x, y = inputs[step % 64], targets[step % 64]
        recorder.start_batch(step, 8)
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        out = model(x)
        recorder.register_tensor("out", out)
        loss = (out - y).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        if with_kpis:
            recorder.record_kpi_in_graph("loss", "", loss, record_even_if_recording_is_inactive=True)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
    return Loop(recorded_step, recorder.finalize, recorder)


def top_tracebacks(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, count: int = 20) -> list[str]:
    ignored = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>")]
    before, after = before.filter_traces(ignored), after.filter_traces(ignored)
    lines = []
    for difference in after.compare_to(before, "traceback")[:count]:
        frames = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in difference.traceback[:6])
        lines.append(f"{difference.size_diff / 1024:+9.1f} KiB {difference.count_diff:+7d} blocks  {frames}")
    return lines


def child(mode: str, steps: int, every: int, trace: bool, snapshots: list[int],
          writer_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """One mode in this interpreter: samples at every hundredth of the run, object counts at the middle and
    the end, tracemalloc snapshots where asked."""
    if trace:
        tracemalloc.start(12)
    root = Path(tempfile.mkdtemp(prefix=f"comgra-controls-{mode}-"))
    loop = make_step(mode, root, every, writer_options)
    step, finish = loop.step, loop.finish
    buffered = None if loop.recorder is None else (lambda: writer_buffer_mib(loop.recorder))
    marks = {steps * q // 100 for q in range(1, 101)}
    samples, counts, taken = [], {}, {}
    began, cpu = time.perf_counter(), time.process_time()
    for number in range(steps):
        step(number)
        done = number + 1
        if done in marks:
            samples.append((done, {**sample(buffered), "seconds": time.perf_counter() - began}))
        if done in (steps // 2, steps):
            counts[done] = object_counts()
        if trace and done in snapshots:
            gc.collect()
            taken[done] = tracemalloc.take_snapshot()
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    finish()
    shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {"mode": mode, "steps": steps, "seconds": seconds, "cpu_seconds": cpu, "samples": samples,
                              "objects": {str(k): v for k, v in counts.items()}}
    if len(taken) == 2:
        first, last = sorted(taken)
        result["tracemalloc"] = {"between": [first, last], "top": top_tracebacks(taken[first], taken[last])}
    return result


def start_child(mode: str, args: argparse.Namespace) -> tuple[subprocess.Popen, Path]:
    """One mode in a fresh interpreter; its figures go to RESULTS/MODE.json (kept: ``--report`` reads them again)."""
    out = args.results / f"{mode}.json"
    command = [sys.executable, __file__, "--child", mode, "--steps", str(args.steps), "--every", str(args.every),
               "--snapshots", args.snapshots, "--out", str(out)] + \
        (["--tracemalloc", mode] if args.tracemalloc == mode else []) + \
        (["--max-flush-seconds", str(args.max_flush_seconds)] if args.max_flush_seconds is not None else []) + \
        (["--max-buffered-bytes", str(args.max_buffered_bytes)] if args.max_buffered_bytes is not None else [])
    return subprocess.Popen(command), out


def run_children(modes: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """In sequence, or with ``--parallel`` all at once (on a machine shared with other work, the modes then
    see the same load, and a slow machine finishes sooner)."""
    results = []
    batches = [modes] if args.parallel else [[mode] for mode in modes]
    for batch in batches:
        started = [start_child(mode, args) for mode in batch]
        for process, out in started:
            if process.wait() != 0:
                raise SystemExit(f"{out.stem}: the child failed (exit {process.returncode})")
            result = json.loads(out.read_text())
            print(f"{result['mode']:10s} {result['steps']} steps in {result['seconds']:.1f} s "
                  f"({result['seconds'] / result['steps'] * 1e6:.0f} us/step, CPU of every thread "
                  f"{result['cpu_seconds'] / result['steps'] * 1e6:.0f} us/step); load {os.getloadavg()[0]:.1f}", flush=True)
            results.append(result)
    return results


def slope(samples: list[tuple[int, dict[str, float]]], name: str) -> tuple[float, float, float]:
    """Theil-Sen slope per 10,000 steps over the second half, with its 95% interval."""
    from scipy.stats import theilslopes

    second = samples[len(samples) // 2:]
    estimate, _, low, high = theilslopes([s[name] for _, s in second], [n / 10_000 for n, _ in second])
    return estimate, low, high


def report(results: list[dict[str, Any]]) -> None:
    control = next((r for r in results if r["mode"] == "torch"), None)
    print(f"\nslopes over the second half, per 10,000 steps (95% interval); 'net' less the torch control")
    for name in FIGURES:
        print(f"  {name} ({UNITS[name]}):")
        base = slope(control["samples"], name)[0] if control and name in control["samples"][0][1] else None
        for result in results:
            if name not in result["samples"][0][1]:
                continue
            estimate, low, high = slope(result["samples"], name)
            net = "" if base is None or result is control else f"   net {estimate - base:+9.3f}"
            first, last = result["samples"][0][1][name], result["samples"][-1][1][name]
            print(f"    {result['mode']:10s} {estimate:+9.3f} ({low:+9.3f} to {high:+9.3f}){net}   "
                  f"first sample {first:10.2f}, last {last:10.2f}")
    print("\nPython objects (gc-tracked) whose count grew between the middle and the end of the run:")
    for result in results:
        middle, end = (result["objects"][str(k)] for k in (result["steps"] // 2, result["steps"]))
        grown = sorted(((end.get(t, 0) - middle.get(t, 0), t) for t in set(end) | set(middle)), reverse=True)
        shown = ", ".join(f"{t} {d:+d}" for d, t in grown[:8] if d > 0) or "none"
        print(f"  {result['mode']:10s} {shown}  (all tracked: {sum(middle.values())} -> {sum(end.values())})")
    for result in results:
        if "tracemalloc" in result:
            first, last = result["tracemalloc"]["between"]
            print(f"\ntracemalloc, mode {result['mode']}: the 20 tracebacks that grew most from step {first} to {last}")
            for line in result["tracemalloc"]["top"]:
                print("  " + line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--every", type=int, default=100, help="record one step in this many (default: 100)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--tracemalloc", choices=MODES, help="trace this mode's Python heap (about 2x slower)")
    parser.add_argument("--snapshots", default="", help="two step counts for the tracemalloc diff "
                                                        "(default: the middle and the end)")
    parser.add_argument("--max-flush-seconds", type=float,
                        help="the writer's cap on its flush interval (default: the writer's, 30 s)")
    parser.add_argument("--max-buffered-bytes", type=int,
                        help="the writer's bound on the Arrow bytes it holds before a flush (0: none; default: "
                             "the writer's)")
    parser.add_argument("--parallel", action="store_true", help="run the modes at once, not one after the other")
    parser.add_argument("--results", type=Path, help="where each mode's figures go (default: a new temporary folder)")
    parser.add_argument("--report", action="store_true", help="only print the report of the figures in --results")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.results = args.results or Path(tempfile.mkdtemp(prefix="comgra-controls-results-"))
    args.snapshots = args.snapshots or f"{args.steps // 2},{args.steps}"
    if args.child:
        snapshots = [int(s) for s in args.snapshots.split(",")]
        writer_options: dict[str, Any] = {}
        if args.max_flush_seconds is not None:
            writer_options["max_flush_seconds"] = args.max_flush_seconds
        if args.max_buffered_bytes is not None:
            writer_options["max_buffered_bytes"] = args.max_buffered_bytes or None
        result = child(args.child, args.steps, args.every, args.tracemalloc == args.child, snapshots, writer_options)
        Path(args.out).write_text(json.dumps(result))
        return
    modes = args.modes.split(",")
    if args.report:
        report([json.loads((args.results / f"{mode}.json").read_text()) for mode in modes
                if (args.results / f"{mode}.json").exists()])
        return
    args.results.mkdir(parents=True, exist_ok=True)
    print(f"figures of each mode in {args.results}", flush=True)
    report(run_children(modes, args))


if __name__ == "__main__":
    main()

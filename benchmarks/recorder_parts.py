"""Where one recorded step's time goes: the recorder's parts, each on its own thread's CPU clock.

Runs a workload of benchmarks/recording_workloads.py with every step recorded, wraps the recorder's
entry points and the threads it hands work to, and prints per recorded step, for each part, the
wall time and the CPU time of the thread it ran on (the thread CPU clock is what other processes on
a shared machine disturb least). The first ``--warmup`` recorded steps are left out.

    python benchmarks/recorder_parts.py --workload resnet18 --steps 40
    python benchmarks/recorder_parts.py --parameter-statistics --steps 20   # the statistics alone

Parts on the training thread: the recorder's public calls (start_batch registers the parameters,
start_iteration hands their statistics to the worker, register_tensor, record_current_gradients
summarises the parameters' gradients, finish_iteration walks the graph, finish_batch builds the
rows and queues them), with the statistics and row building inside them shown apart. Parts on other
threads: the statistics worker (the parameters' values) and the writer (sorting, Parquet encoding,
compaction). ``training`` is the rest of the step: the model itself.
"""
from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import recording_workloads as workloads  # noqa: E402

_TOTALS: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])  # part -> [wall, thread cpu, calls]
_LOCAL = threading.local()


def _timed(part: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` timed into ``part``; a timed call inside another timed call of the same thread is
    counted in both (the inner parts are a breakdown of the outer ones)."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            total = _TOTALS[part]
            total[0] += time.perf_counter() - wall
            total[1] += time.thread_time() - cpu
            total[2] += 1
    return wrapper


def _instrument() -> None:
    from comgra import recorder
    from comgra.capture import background, stats, step, summaries
    from comgra.store import writer
    for name in ("start_batch", "start_iteration", "register_tensor", "record_current_gradients",
                 "finish_iteration", "finish_batch"):
        setattr(recorder.ComgraRecorder, name, _timed(name, getattr(recorder.ComgraRecorder, name)))
    # Inside the calls above (same thread) or on the worker (background Job).
    stats._cpu_large_statistics = _timed("  statistics: large tensors", stats._cpu_large_statistics)
    if hasattr(stats, "_summary_in_the_kernel"):  # the summary with no views (absent before it existed)
        stats._summary_in_the_kernel = _timed("  statistics: kernel, no views", stats._summary_in_the_kernel)
    stats._GROUP_STATISTICS["large"] = stats._large_statistics = _timed(
        "  statistics: large (all)", stats._large_statistics)
    stats._GROUP_STATISTICS["small"] = _timed("  statistics: small tensors", stats._GROUP_STATISTICS["small"])
    summaries.largest_singular_values = _timed("  spectral norms", summaries.largest_singular_values)
    summaries._rows = _timed("  rows: Arrow table", summaries._rows)
    step.to_table = _timed("  rows: transfer + table", step.to_table)
    step.StepRecording._graph_of_iteration = _timed("  graph walk", step.StepRecording._graph_of_iteration)
    original_job_init = background.Job.__init__

    def job_init(self: Any, compute: Callable[..., Any], items: Any) -> None:
        original_job_init(self, _timed("worker thread: statistics job", compute), items)
    background.Job.__init__ = job_init  # type: ignore[method-assign]
    writer.ChunkWriter._write_buffer = _timed("writer thread: chunk writes", writer.ChunkWriter._write_buffer)
    writer.ChunkWriter._merge = _timed("writer thread:   of which merges", writer.ChunkWriter._merge)


def _time_garbage_collections() -> None:
    """The garbage collector's passes, by generation, on the clocks of the thread that triggered them (a
    recorded step that holds many Python objects at once makes the collector run; without comgra a step of
    these workloads holds too few to make it run at all)."""
    started: dict[int, tuple[float, float]] = {}

    def callback(phase: str, info: dict[str, int]) -> None:
        thread = threading.get_ident()
        if phase == "start":
            started[thread] = (time.perf_counter(), time.thread_time())
        elif thread in started:
            wall, cpu = started.pop(thread)
            total = _TOTALS[f"garbage collector, generation {info['generation']}"]
            total[0] += time.perf_counter() - wall
            total[1] += time.thread_time() - cpu
            total[2] += 1
    gc.callbacks.append(callback)


def measure(workload: str, steps: int, warmup: int, out: Path) -> dict[str, Any]:
    import comgra
    from comgra import objects
    _instrument()
    _time_garbage_collections()
    model, optimizer, step_function = workloads.prepare(workload)
    rec = workloads.make_recorder(comgra, objects, "all", out, f"parts_{workload}", 1)
    comgra.my_recorder = rec
    rec.track_module("main_model", model)
    for step in range(warmup):
        step_function(rec, model, optimizer, step)
    rec.session.writer.flush()
    _TOTALS.clear()
    wall, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
    for step in range(warmup, warmup + steps):
        step_function(rec, model, optimizer, step)
    main_wall, main_cpu = time.perf_counter() - wall, time.thread_time() - cpu
    rec.finalize()  # the writer's last chunk counts: a longer run pays it too
    process_cpu = time.process_time() - process
    return {"totals": dict(_TOTALS), "steps": steps, "main_wall": main_wall, "main_cpu": main_cpu,
            "process_cpu": process_cpu}


def report(result: dict[str, Any]) -> None:
    steps, totals = result["steps"], result["totals"]
    print(f"per recorded step, mean over {steps} recorded steps (ms)")
    print(f"{'part':<40}{'wall':>8}{'thread cpu':>12}{'calls':>7}")
    public = ("start_batch", "start_iteration", "register_tensor", "record_current_gradients",
              "finish_iteration", "finish_batch")
    recorder_wall = sum(totals.get(p, [0, 0, 0])[0] for p in public)
    recorder_cpu = sum(totals.get(p, [0, 0, 0])[1] for p in public)
    for part, (wall, cpu, calls) in sorted(totals.items(), key=lambda item: _order(item[0])):
        print(f"{part:<40}{wall / steps * 1e3:>8.2f}{cpu / steps * 1e3:>12.2f}{calls / steps:>7.1f}")
    print(f"{'recorder calls, training thread':<40}{recorder_wall / steps * 1e3:>8.2f}{recorder_cpu / steps * 1e3:>12.2f}")
    print(f"{'training (the rest of the step)':<40}{(result['main_wall'] - recorder_wall) / steps * 1e3:>8.2f}"
          f"{(result['main_cpu'] - recorder_cpu) / steps * 1e3:>12.2f}")
    print(f"{'whole step, training thread':<40}{result['main_wall'] / steps * 1e3:>8.2f}{result['main_cpu'] / steps * 1e3:>12.2f}")
    print(f"{'all threads CPU (incl. finalize)':<40}{'':>8}{result['process_cpu'] / steps * 1e3:>12.2f}")


def _order(part: str) -> tuple[int, str]:
    names = ["start_batch", "start_iteration", "register_tensor", "record_current_gradients", "finish_iteration",
             "finish_batch"]
    if part in names:
        return names.index(part) * 2, part
    if part.startswith("  "):
        return 20, part
    if part.startswith("garbage"):
        return 40, part
    return 30, part


def parameter_statistics(workload: str, steps: int, warmup: int) -> None:
    """The statistics of the parameters and of their gradients alone, on this thread's CPU clock, after
    each real training step (so the values are where a recorded step finds them, not in the cache)."""
    import torch
    import torch.nn.functional  # noqa: F401 - the workloads use it
    from comgra.capture import fused, summaries
    from comgra.capture.registry import Registration
    torch.manual_seed(0)
    torch.set_num_threads(1)
    fused.ensure_built()
    model_class, _ = workloads.WORKLOADS[workload]
    model = model_class()
    optimizer = workloads.make_optimizer(workload, model)
    registrations = [Registration(name, -1, name, name, "parameter", "neuron", None, False, tuple(p.shape), p)
                     for name, p in model.named_parameters()]
    times: dict[str, list[float]] = {"gradients": [], "values": []}
    for step in range(warmup + steps):
        optimizer.zero_grad()
        if not workload.startswith("resnet"):
            raise SystemExit("--parameter-statistics: resnet workloads only")
        logits = model(torch.randn(8, 3, 32, 32))
        torch.nn.functional.cross_entropy(logits, torch.randint(0, 10, (8,))).backward()
        optimizer.step()
        for kind, items in (("gradients", [(r, p.grad) for r, p in zip(registrations, model.parameters())]),
                            ("values", [(r, p.detach()) for r, p in zip(registrations, model.parameters())])):
            start = time.thread_time()
            summaries.summarize_values(kind, items, max_neurons=5, with_svd=True)
            if step >= warmup:
                times[kind].append(time.thread_time() - start)
    for kind, values in times.items():
        values.sort()
        print(f"{workload} parameter {kind}: median {values[len(values) // 2] * 1e3:.2f} ms, "
              f"lowest {values[0] * 1e3:.2f} ms of thread CPU over {len(values)} steps")


def main(argv: list[str] | None = None) -> None:
    import warnings
    warnings.simplefilter("ignore")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(workloads.WORKLOADS), default="resnet18")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--parameter-statistics", action="store_true",
                        help="time only the statistics of the parameters and their gradients after each step")
    args = parser.parse_args(argv)
    if args.parameter_statistics:
        parameter_statistics(args.workload, args.steps, args.warmup)
        return
    with tempfile.TemporaryDirectory() as folder:
        report(measure(args.workload, args.steps, args.warmup, Path(folder)))


if __name__ == "__main__":
    main()

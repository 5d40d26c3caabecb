"""What each part of comgra costs the training thread and the process, per recorded and per unrecorded step
(issue 34), beside the ratio against plain training measured in the same process.

    python benchmarks/cost_breakdown.py                       # every workload of breakdown_workloads.py
    python benchmarks/cost_breakdown.py --workload mlp conv --rounds 9 --profile

For each workload, two phases in one process:

1. **Ratios.** A plain copy of the model (no comgra call at all) and a recorded copy (same seed) train in
   blocks of ``--block`` steps (a multiple of the policy's gap), interleaved, the order alternating each
   round. Per mode: the median over the rounds of (comgra block / the round's plain block) on the wall
   clock, on the training thread's CPU clock (``time.thread_time``) and on the process's CPU clock (every
   thread: the writer's and the statistics worker's work too), with the lowest and highest round.
   The MLP's ``every1`` mode gives a recorded step's fixed cost (its block minus the plain block, per
   step), its ``never`` mode an unrecorded step's cost.
2. **Breakdown.** The comgra copy trains on alone, with timers around each part (exclusive times: a part
   called inside another is counted in the inner one only), on the clock of the thread it runs on, split
   into recorded and unrecorded steps. The writer's and the statistics worker's parts run on their own
   threads; they are given per recorded step (their total over the recorded steps). ``--profile`` adds a
   cProfile of the same steps (the functions of comgra with the most own time), to cross-check the timers.

Prints the load average before and after: a 2-core machine shared with other work makes every figure
noisy; read the ratios of the same run, never figures of different runs.
"""
from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import math
import os
import pstats
import statistics
import sys
import tempfile
import threading
import time
import warnings
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import breakdown_workloads as wl  # noqa: E402

_MAIN = threading.main_thread().ident
# (part, on the training thread) -> [wall, cpu, calls], for the current step; folded into _RECORDED or _PLAIN
_STEP: dict[tuple[str, bool], list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
_RECORDED: dict[tuple[str, bool], list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
_UNRECORDED: dict[tuple[str, bool], list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
_LOCAL = threading.local()
_LOCK = threading.Lock()
_STATE = {"recorded": False}


def _timed(part: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` timed into ``part``, exclusive of the timed parts it calls (a stack per thread)."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        stack = getattr(_LOCAL, "stack", None)
        if stack is None:
            stack = _LOCAL.stack = []
        stack.append([0.0, 0.0])  # the time of the timed parts inside this one
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent_wall, spent_cpu = time.perf_counter() - wall, time.thread_time() - cpu
            inner = stack.pop()
            if stack:
                stack[-1][0] += spent_wall
                stack[-1][1] += spent_cpu
            with _LOCK:
                total = _STEP[(part, threading.get_ident() == _MAIN)]
                total[0] += spent_wall - inner[0]
                total[1] += spent_cpu - inner[1]
                total[2] += 1
    wrapper.__wrapped__ = function  # type: ignore[attr-defined]
    return wrapper


def _patch(owner: Any, name: str, part: str) -> None:
    if hasattr(owner, name):
        setattr(owner, name, _timed(part, getattr(owner, name)))


def instrument(calls_only: bool = False) -> None:
    """Timers around comgra's parts; tolerant of an older tree where a part does not exist. ``calls_only``: around
    the recorder's public calls alone (the least timer overhead: comgra's whole cost on the training thread)."""
    from comgra import recorder
    from comgra.capture import evidence, session, step, summaries
    from comgra.store import writer
    for name in ("start_batch", "start_iteration", "register_tensor", "record_current_gradients",
                 "finish_iteration", "finish_batch"):
        _patch(recorder.ComgraRecorder, name, "recorder: every public call" if calls_only else
               "recorder: call checks, step state")
    if calls_only:
        _note_recording(evidence)
        return
    _patch(session.Session, "register", "registration (recorded steps)")
    _patch(session.Session, "start_step", "registration (recorded steps)")
    _patch(step.StepRecording, "_graph_of_iteration", "graph walk")
    _patch(summaries, "summarize_values", "statistics")
    _patch(summaries, "to_table", "rows: transfer + Arrow table")
    _patch(session.Session, "finish_step", "rows: finish_step, queue")
    _patch(step.StepRecording, "to_tables", "rows: to_tables")
    _patch(step.StepRecording, "record_gradients", "gradients: snapshot")
    _patch(summaries, "largest_singular_values", "statistics: spectral norms")
    _patch(evidence.RunEvidence, "_table" if hasattr(evidence.RunEvidence, "_table") else "_put", "evidence: Arrow table")
    try:
        from comgra.capture import background
        _patch(background.Job, "wait", "waiting for the statistics worker")
    except ImportError:
        pass
    _patch(writer.ChunkWriter, "_put", "queue to the writer (GIL waits)")
    _patch(session.Session, "flush_kpis", "KPIs")
    for name in ("start_batch", "register", "gradients", "finish_batch"):
        _patch(evidence.RunEvidence, name, "evidence: modes, dtypes, groups")
    _patch(evidence, "_fingerprints", "evidence: fingerprints")
    try:
        from comgra.breakpoints import recording, sentinels
        for name in ("start_batch", "register", "finish_batch", "close"):
            _patch(sentinels.Sentinels, name, "sentinels")
        for name in ("start_batch", "start_iteration", "register", "gradients", "keep", "settle", "finish_batch"):
            _patch(recording.RecorderBreakpoints, name, "live control: breakpoint poll")
    except ImportError:
        pass
    try:
        from comgra.profiling import instruments
        for name in ("start_step", "finish_step"):
            _patch(instruments.Instruments, name, "profiling instruments (off)")
    except ImportError:
        pass
    _patch(writer.ChunkWriter, "_write_buffer", "writer: sort, stage, publish")
    _patch(writer.ChunkWriter, "_merge", "writer: merges")
    encode = writer._encode

    def encode_and_checksum(name: str, tmp: Path, table: Any, compression: str) -> None:
        encode(name, tmp, table, compression)
        # The page checksums are a CRC32 of each page's bytes: as much as a CRC32 of the file, timed alone.
        data = Path(tmp).read_bytes()
        _checksum(data)
    writer._encode = _timed("writer: Parquet encoding", encode_and_checksum)
    _checksum = _timed("writer:   of which page checksums (CRC32, est.)", zlib.crc32)
    started: dict[int, tuple[float, float]] = {}

    def collector(phase: str, info: dict[str, int]) -> None:
        thread = threading.get_ident()
        if phase == "start":
            started[thread] = (time.perf_counter(), time.thread_time())
        elif thread in started:
            wall, cpu = started.pop(thread)
            with _LOCK:
                total = _STEP[("garbage collector", thread == _MAIN)]
                total[0] += time.perf_counter() - wall
                total[1] += time.thread_time() - cpu
                total[2] += 1
    gc.callbacks.append(collector)
    _note_recording(evidence)


def _note_recording(evidence: Any) -> None:
    """Whether the current step is recorded, as the recorder tells the evidence at start_batch."""
    original = evidence.RunEvidence.start_batch

    def note_recording(self: Any, training_step: int, kind: Any, batch_size: int, recording: bool) -> None:
        _STATE["recorded"] = recording
        return original(self, training_step, kind, batch_size, recording)
    evidence.RunEvidence.start_batch = note_recording


def _fold(recorded: bool) -> None:
    with _LOCK:
        target = _RECORDED if recorded else _UNRECORDED
        for key, (wall, cpu, calls) in _STEP.items():
            total = target[key]
            total[0] += wall
            total[1] += cpu
            total[2] += calls
        _STEP.clear()


def _block(trainer: wl.Trainer, batches: list[Any]) -> tuple[float, float, float]:
    wall, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
    for batch in batches:
        trainer.step(batch)
    return time.perf_counter() - wall, time.thread_time() - cpu, time.process_time() - process


MIN_BLOCK_STEPS = 20  # a block of one step (the MLP recorded every step) is one sample of the machine's noise


def block_steps(gap: int, blocks: int) -> int:
    """Steps per block: ``blocks`` policy gaps, and whole gaps up to at least MIN_BLOCK_STEPS."""
    return gap * max(blocks, -(-MIN_BLOCK_STEPS // gap))


def ratios(workload: wl.Workload, mode: str, rounds: int, block: int, root: Path) -> dict[str, Any]:
    """Plain and comgra copies of the model, interleaved block by block; see the module's doc."""
    import comgra
    recorder = wl.make_recorder(root, f"{workload.name}_{mode}_{os.getpid()}", mode)
    plain, recorded = wl.Trainer(workload, None), wl.Trainer(workload, recorder)
    recorded.model.load_state_dict(plain.model.state_dict())
    batches = [workload.batch(step) for step in range(block)]
    for trainer in (plain, recorded, plain, recorded):  # warm-up (compiles, first recorded step, kernels)
        _block(trainer, batches)
    times: dict[str, list[tuple[float, float, float]]] = {"plain": [], "comgra": []}
    for round_ in range(rounds):
        pair = [("plain", plain), ("comgra", recorded)]
        for name, trainer in (pair if round_ % 2 == 0 else pair[::-1]):
            times[name].append(_block(trainer, batches))
    recorder.finalize()
    comgra.my_recorder = None
    result: dict[str, Any] = {"mode": mode, "block": block, "rounds": rounds}
    for clock, index in (("wall", 0), ("thread", 1), ("process", 2)):
        rows = [c[index] / p[index] for c, p in zip(times["comgra"], times["plain"])]
        extra = [(c[index] - p[index]) / block * 1e3 for c, p in zip(times["comgra"], times["plain"])]
        result[clock] = (statistics.median(rows), min(rows), max(rows))
        result[f"{clock}_ms_per_step"] = (statistics.median(extra), statistics.median(
            p[index] for p in times["plain"]) / block * 1e3)
        # The least disturbed blocks of each side (a busy machine only ever adds time): a second estimate of the
        # extra ms per step, steadier than the median where other processes come and go.
        result[f"{clock}_floor_ms"] = (min(c[index] for c in times["comgra"]) - min(
            p[index] for p in times["plain"])) / block * 1e3
    return result


def breakdown(workload: wl.Workload, mode: str, steps: int, root: Path, profile: bool) -> dict[str, Any]:
    import comgra
    recorder = wl.make_recorder(root, f"{workload.name}_parts_{os.getpid()}", mode)
    trainer = wl.Trainer(workload, recorder)
    batches = [workload.batch(step) for step in range(steps)]
    for batch in batches[:2 * int(mode[5:] or 1)]:  # warm-up
        trainer.step(batch)
    recorder.flush()
    _STEP.clear(), _RECORDED.clear(), _UNRECORDED.clear()
    counts = {True: 0, False: 0}
    profiler = cProfile.Profile() if profile else None
    for batch in batches:
        if profiler:
            profiler.enable()
        trainer.step(batch)
        if profiler:
            profiler.disable()
        counts[_STATE["recorded"]] += 1
        _fold(_STATE["recorded"])
    recorder.finalize()  # the writer's last chunk: a longer run pays it too
    comgra.my_recorder = None
    _fold(True)  # what the writer did after the last step: recorded steps' work
    return {"recorded": dict(_RECORDED), "unrecorded": dict(_UNRECORDED), "counts": counts, "profiler": profiler}


def report_breakdown(name: str, found: dict[str, Any]) -> None:
    counts = found["counts"]
    print(f"\n{name}: ms per step, exclusive times ({counts[True]} recorded, {counts[False]} unrecorded steps; "
          "other threads' work per recorded step)")
    print(f"  {'part':<48}{'thread':>9}{'rec wall':>10}{'rec cpu':>9}{'unrec wall':>12}{'unrec cpu':>10}")
    keys = sorted(set(found["recorded"]) | set(found["unrecorded"]), key=lambda k: (not k[1], k[0]))
    sums = {True: [0.0, 0.0, 0.0, 0.0], False: [0.0, 0.0, 0.0, 0.0]}
    for key in keys:
        part, main = key
        rec = found["recorded"].get(key, [0.0, 0.0, 0])
        unrec = found["unrecorded"].get(key, [0.0, 0.0, 0])
        cells = [rec[0] / max(1, counts[True]), rec[1] / max(1, counts[True]),
                 unrec[0] / max(1, counts[False]), unrec[1] / max(1, counts[False])]
        if not main:  # the writer and the worker: their whole work over the recorded steps
            cells = [(rec[0] + unrec[0]) / max(1, counts[True]), (rec[1] + unrec[1]) / max(1, counts[True]), 0.0, 0.0]
        if "of which" not in part:
            sums[main] = [a + b for a, b in zip(sums[main], cells)]
        print(f"  {part:<48}{'training' if main else 'other':>9}" + "".join(
            f"{value * 1e3:>{width}.3f}" for value, width in zip(cells, (10, 9, 12, 10))))
    for main, label in ((True, "comgra on the training thread"), (False, "comgra on other threads")):
        print(f"  {label:<48}{'':>9}" + "".join(f"{v * 1e3:>{w}.3f}" for v, w in zip(sums[main], (10, 9, 12, 10))))
    profiler = found["profiler"]
    if profiler is not None:
        print(f"  cProfile of the same steps (training thread), comgra's functions by own time, ms per step:")
        stats = pstats.Stats(profiler)
        rows = [(tt, ct, calls, f"{Path(file).name}:{line}({function})")
                for (file, line, function), (_, calls, tt, ct, _) in stats.stats.items()  # type: ignore[attr-defined]
                if f"{os.sep}comgra{os.sep}" in file]
        total = counts[True] + counts[False]
        for tt, ct, calls, label in sorted(rows, reverse=True)[:15]:
            print(f"    {label:<70} own {tt / total * 1e3:7.3f}  cumulative {ct / total * 1e3:7.3f}  calls {calls}")


def unrecorded_calls(root: Path, blocks: int = 5, steps: int = 3000) -> float:
    """Thread CPU (us) of an unrecorded step's recorder calls alone, no model: start_batch, start_iteration, nine
    register_tensor (seven 8x4 tensors, a 64x10 output and a scalar loss, both watched by the sentinels),
    record_current_gradients, finish_iteration, finish_batch; the lowest of ``blocks`` blocks (the least disturbed
    by other processes)."""
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder
    model = torch.nn.Linear(4, 4)
    recorder = ComgraRecorder(str(root), "bench", f"calls_{os.getpid()}", DecisionMakerForRecordingsHardcoded(set()))
    recorder.track_module("model", model)
    if hasattr(recorder, "_evidence"):
        recorder._evidence.sentinels.outputs.add("output")  # as a recorded step's graph would have taught it
    hidden, output, loss = torch.randn(8, 4), torch.randn(64, 10), torch.tensor(1.0)
    best, number = math.inf, 0
    for block in range(blocks + 1):
        start = time.thread_time()
        for _ in range(steps):
            recorder.start_batch(number, 8)
            recorder.start_iteration()
            for index in range(7):
                recorder.register_tensor(f"hidden{index}", hidden)
            recorder.register_tensor("output", output)
            recorder.register_tensor("loss", loss, is_loss=True)
            recorder.record_current_gradients("gradients")
            recorder.finish_iteration()
            recorder.finish_batch()
            number += 1
        if block:  # the first block warms up
            best = min(best, (time.thread_time() - start) / steps * 1e6)
    recorder.finalize()
    return best


def calls_per_step(workload: wl.Workload, mode: str, root: Path, steps: int = 20) -> dict[str, float]:
    """What runs per step, counted (not timed: the same on a busy machine as on a quiet one): the Python functions
    of comgra's package called per step (``comgra_python``), the calls of C functions made from them (``comgra_c``:
    torch ops, NumPy, builtins) and every Python call of the step (``all_python``: torch.optim's too), over
    ``steps`` steps after a warm-up, with ``sys.setprofile``. ``mode``: "every1" counts recorded steps, "never"
    unrecorded ones."""
    import comgra
    package = os.sep + "comgra" + os.sep
    recorder = wl.make_recorder(root, f"{workload.name}_calls_{mode}_{os.getpid()}", mode)
    trainer = wl.Trainer(workload, recorder)
    batches = [workload.batch(step) for step in range(steps)]
    for batch in batches[:4]:
        trainer.step(batch)
    counts = {"comgra_python": 0, "comgra_c": 0, "all_python": 0}

    def count(frame: Any, event: str, _arg: Any) -> None:
        if event == "call":
            counts["all_python"] += 1
            if package in frame.f_code.co_filename:
                counts["comgra_python"] += 1
        elif event == "c_call" and package in frame.f_code.co_filename:
            counts["comgra_c"] += 1
    sys.setprofile(count)
    try:
        for batch in batches:
            trainer.step(batch)
    finally:
        sys.setprofile(None)
    recorder.finalize()
    comgra.my_recorder = None
    return {key: value / steps for key, value in counts.items()}


def report_ratios(name: str, found: dict[str, Any]) -> None:
    cells = []
    for clock in ("wall", "thread", "process"):
        median, low, high = found[clock]
        extra, plain = found[f"{clock}_ms_per_step"]
        cells.append(f"{median:6.3f}x ({low:.2f}-{high:.2f}) {extra:+7.3f} ms of {plain:6.2f}")
    print(f"  {name:<14}{found['mode']:<10}" + "  ".join(cells))


def main(argv: list[str] | None = None) -> None:
    warnings.simplefilter("ignore")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", nargs="+", choices=sorted(wl.WORKLOADS), default=sorted(wl.WORKLOADS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--blocks", type=int, default=1, help="policy gaps per block (block = gap x this)")
    parser.add_argument("--steps", type=int, default=0, help="steps of the breakdown (default: 3 gaps, >= 30)")
    parser.add_argument("--no-ratios", action="store_true")
    parser.add_argument("--no-breakdown", action="store_true")
    parser.add_argument("--profile", action="store_true", help="cross-check the timers with cProfile")
    parser.add_argument("--calls-only", action="store_true",
                        help="time the recorder's public calls alone (comgra's whole cost on the training thread)")
    parser.add_argument("--every", type=int, default=0, help="the breakdown's policy gap (default: the workload's)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        from comgra.capture import fused
        fused.ensure_built()
    except ImportError:
        pass
    print(f"torch {torch.__version__}, 1 thread, load average before: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        if not args.no_ratios:
            print(f"\nratios against plain training, median of {args.rounds} interleaved rounds (lowest-highest); "
                  "each: comgra's extra ms per step of the plain step's ms")
            print(f"  {'workload':<14}{'mode':<10}{'wall clock':<42}{'training thread CPU':<42}process CPU")
            for name in args.workload:
                workload = wl.WORKLOADS[name]
                modes = [f"every{workload.every}", *workload.extra_modes]
                for mode in modes:
                    gap = workload.every if mode.startswith("every") else 10
                    report_ratios(name, ratios(workload, mode, args.rounds, block_steps(gap, args.blocks), root))
        if not args.no_ratios:
            print("\ncalls per step, counted (sys.setprofile): comgra's Python functions, the C functions they call, "
                  "all Python calls of the step")
            for name in args.workload:
                for mode, label in (("every1", "recorded"), ("never", "unrecorded")):
                    found = calls_per_step(wl.WORKLOADS[name], mode, root)
                    print(f"  {name:<14}{label:<12}comgra Python {found['comgra_python']:7.0f}  comgra -> C "
                          f"{found['comgra_c']:7.0f}  all Python {found['all_python']:7.0f}")
            print(f"\nan unrecorded step's recorder calls alone (no model; see unrecorded_calls): "
                  f"{unrecorded_calls(root):.1f} us of training-thread CPU, the lowest of 5 blocks")
        if not args.no_breakdown:
            instrument(args.calls_only)
            for name in args.workload:
                workload = wl.WORKLOADS[name]
                every = args.every or workload.every
                steps = args.steps or max(30, 3 * every)
                report_breakdown(f"{name} (1 in {every})", breakdown(workload, f"every{every}", steps, root, args.profile))
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""Cost of per-layer profiling and of resource sampling, side by side in one process.

Variants, interleaved step by step in a random order (a slow spell of a noisy machine hits them alike), each
figure the seconds per training step, median and best over the rounds (a round: ``--steps`` steps of each), each divided by the same statistic of
``off``, and "paired" (the median of each round's ratio to ``off`` in that round). Three clocks:
wall-clock time; the CPU time of the process (``cpu``, all its threads: the writer and the resource
sampler included; on a machine shared with other jobs the steadier figure); the CPU time of the
training thread alone (``main``: everything the profiler does per call and per step happens there,
the writer's Parquet work for the ``layers`` table does not):

  none       the recorder present with comgra_is_active=False (no comgra)
  off        comgra recording on the tutorial's sparse schedule, modules tracked, profiling off
  on         the same with track_module(..., profile=True) (backward marks by the C++ marker, once built)
  on/py      ``on`` with the Python hook as the backward marker (what ``on`` was before the C++ marker, and
             what it is where no C++ compiler builds it)
  on/hooks   ``on`` measured by forward hooks instead of the class-level forward wrappers (the fallback
             path, and what every module used before the wrappers): what the wrappers save
  on/10      profiling every 10th step (profile_every=10)
  resources  ``off`` plus resource sampling every second (resource_seconds=1.0)

Workloads: the tutorial's recurrent network (comgra.examples.tutorial; 9 small modules called once
per iteration, up to 20 iterations per step: many hook calls per millisecond of compute) and a small
GPT-2 built from a config (transformers, 2 layers, 128 wide, sequence 64, batch 8: 30 modules).

Two costs too small to see in a step time are measured directly: what the recorder's per-step calls
into the instruments cost with profiling and sampling off, and the CPU time of one resource sample
(psutil; NVML where there is a GPU), set against the sampling interval.

    python benchmarks/profiling.py [--rounds 5] [--steps 60] [--workloads tutorial,transformer] [--variants off,on]
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import comgra
from comgra.profiling import native_marker
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder

VARIANTS = ("none", "off", "on", "on/py", "on/hooks", "on/10", "resources")


def _recorder(root: Path, trial: str, variant: str, flush_seconds: float) -> ComgraRecorder:
    return ComgraRecorder(root, "bench", trial, DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=1000), comgra_is_active=variant != "none", flush_seconds=flush_seconds,
        resource_seconds=1.0 if variant == "resources" else None, max_num_batch_size_to_record=4,
        profile_every=10 if variant == "on/10" else 1)


def _track(recorder: ComgraRecorder, name: str, model: torch.nn.Module, variant: str) -> None:
    if not variant.startswith("on"):
        _classes_of_its_own(model)
    if variant != "on/hooks":
        recorder.track_module(name, model, profile=variant.startswith("on"))
        if variant == "on/py":
            recorder.instruments.profiler._marks.native_allowed = False  # type: ignore[union-attr]
        return
    from comgra.profiling import forward_wrappers

    attach = forward_wrappers.attach
    forward_wrappers.attach = lambda module, handler: False  # every module takes the hooks fallback
    try:
        recorder.track_module(name, model, profile=True)
    finally:
        forward_wrappers.attach = attach


def _classes_of_its_own(model: torch.nn.Module) -> None:
    """Each module of a variant that profiles nothing becomes an instance of a subclass of its own, with its class's
    forward as its own: in this one process the profiling variants put their class-level wrappers on the classes
    the models share (``Linear``, the tutorial's ``SubNet``), which would add the wrapper's check to every call of
    the baseline too, a cost that a run without profiling never pays. Call before any variant profiles."""
    from comgra.profiling import forward_wrappers

    made: dict[type, type] = {}
    for module in model.modules():
        cls = type(module)
        if cls not in made:
            if forward_wrappers.attached(cls):
                raise RuntimeError(f"{cls.__name__} already carries a profiler's wrapper: build the unprofiled "
                                   "variants first")
            made[cls] = type(cls.__name__, (cls,), {"forward": cls.forward, "__module__": cls.__module__,
                                                    "__qualname__": cls.__qualname__})
        module.__class__ = made[cls]


def tutorial_workload(root: Path, variant: str, flush_seconds: float = 2.0) -> Callable[[int], None]:
    from comgra.examples import tutorial

    torch.manual_seed(0)
    model = tutorial.SequenceSumNetwork(64, activate_output=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    recorder = _recorder(root, f"tutorial-{variant.replace('/', '-')}", variant, flush_seconds)
    _track(recorder, "main_model", model, variant)
    generator = torch.Generator().manual_seed(1)
    batches = [tutorial._make_batch(tutorial.TRAINING_LENGTHS[i % len(tutorial.TRAINING_LENGTHS)], generator,
                                    torch.device("cpu")) for i in range(16)]

    def step(index: int) -> None:
        comgra.my_recorder = recorder
        tutorial._training_step(model, optimizer, index, batches[index % len(batches)])

    step.recorder = recorder  # type: ignore[attr-defined]
    return step


def transformer_workload(root: Path, variant: str, flush_seconds: float = 2.0) -> Callable[[int], None]:
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=256, n_positions=64, n_embd=128, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    recorder = _recorder(root, f"gpt-{variant.replace('/', '-')}", variant, flush_seconds)
    _track(recorder, "gpt", model, variant)
    generator = torch.Generator().manual_seed(1)
    tokens = [torch.randint(0, 256, (8, 64), generator=generator) for _ in range(8)]

    def step(index: int) -> None:
        batch = tokens[index % len(tokens)]
        recorder.start_batch(index, 8)
        recorder.start_iteration()
        loss = model(batch, labels=batch).loss
        recorder.register_tensor("loss", loss, is_loss=True)
        recorder.finish_iteration()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        recorder.finish_batch()

    step.recorder = recorder  # type: ignore[attr-defined]
    return step


WORKLOADS: dict[str, Callable[..., Callable[[int], None]]] = {
    "tutorial": tutorial_workload, "transformer": transformer_workload}


def measure(workload: str, rounds: int, steps: int, root: Path,
            variants: tuple[str, ...] = VARIANTS) -> dict[str, dict[str, list[float]]]:
    """Seconds per step of each variant, per round and clock. Within a round the variants take turns step by step,
    in a new random order at each step: a slow spell of the machine (they last from milliseconds to seconds here)
    hits every variant of the round alike, where blocks of steps per variant would give it to one of them. A round's
    figure per variant is the mean of its steps, so that costs paid on some steps only (a flush of the rows, a
    collection) count in full."""
    made = {variant: WORKLOADS[workload](root, variant)  # the unprofiled first (see _classes_of_its_own)
            for variant in sorted(variants, key=lambda variant: variant.startswith("on"))}
    runs = {variant: made[variant] for variant in variants}
    counters = dict.fromkeys(variants, 0)
    order = random.Random(0)
    for variant, run in runs.items():  # warm-up: first-step costs (FLOP counting, allocations) are not measured
        for _ in range(3):
            run(counters[variant])
            counters[variant] += 1
    writers = {variant: _writer_clock(run) for variant, run in runs.items()}
    writer_start = {variant: _seconds(clock) for variant, clock in writers.items()}
    times: dict[str, list[float]] = {variant: [] for variant in variants}
    cpu: dict[str, list[float]] = {variant: [] for variant in variants}
    main_cpu: dict[str, list[float]] = {variant: [] for variant in variants}
    names = list(runs)
    for _ in range(rounds):
        sums = {variant: [0.0, 0.0, 0.0] for variant in names}
        for _ in range(steps):
            for variant in order.sample(names, len(names)):
                run, total = runs[variant], sums[variant]
                start, start_cpu, start_main = time.perf_counter(), time.process_time(), time.thread_time()
                run(counters[variant])
                total[0] += time.perf_counter() - start
                total[1] += time.process_time() - start_cpu
                total[2] += time.thread_time() - start_main
                counters[variant] += 1
        for variant, (wall, process, main) in sums.items():
            times[variant].append(wall / steps)
            cpu[variant].append(process / steps)
            main_cpu[variant].append(main / steps)
    writer = {variant: [(_seconds(clock) - writer_start[variant]) / (rounds * steps)]
              for variant, clock in writers.items()}
    for variant, run in runs.items():
        profiler = run.recorder.instruments.profiler  # type: ignore[attr-defined]
        if variant.startswith("on") and (profiler is None or not any(
                profiler.history(name) for name in profiler.layer_names)):
            raise RuntimeError(f"{workload} {variant}: the profiler measured nothing (switched off by a fault?)")
        run.recorder.finalize()  # type: ignore[attr-defined]
    return {"wall": times, "cpu": cpu, "main": main_cpu, "writer": writer}


def _writer_clock(run: Any) -> int | None:
    """The CPU clock of the variant's writer thread (where the rows of the layers table become Parquet): the
    process CPU of a round also holds the other variants' background work, this is the variant's own."""
    writer = getattr(getattr(run.recorder, "session", None), "writer", None)
    thread = getattr(writer, "_thread", None)
    if thread is None or thread.ident is None or not hasattr(time, "pthread_getcpuclockid"):
        return None
    return time.pthread_getcpuclockid(thread.ident)


def _seconds(clock: int | None) -> float:
    return math.nan if clock is None else time.clock_gettime(clock)


def report(workload: str, measured: dict[str, dict[str, list[float]]]) -> str:
    """Median and best round per variant, each as a ratio to the same statistic of ``off``: on a shared
    machine the best rounds are the ones least disturbed by other jobs."""
    lines = [f"{workload}:"]
    writer = measured.pop("writer")
    for clock, times in measured.items():
        median_off, best_off = statistics.median(times["off"]), min(times["off"])
        lines += [f"  {clock:4s} {variant:9s} median {statistics.median(values) * 1e3:7.2f} ms "
                  f"({statistics.median(values) / median_off:.3f}x), best {min(values) * 1e3:7.2f} ms "
                  f"({min(values) / best_off:.3f}x), paired {_paired(values, times['off']):.3f}x"
                  for variant, values in times.items()]
    lines.append("  writer thread CPU per step (the variant's own background work): " + ", ".join(
        f"{variant} {seconds[0] * 1e6:.0f} us" for variant, seconds in writer.items()))
    for variant in ("on", "on/py"):
        if variant not in measured["wall"]:
            continue
        low, high = _paired_interval(measured["wall"][variant], measured["wall"]["off"])
        lines.append(f"  target (profiling on every step at most 1.10x 'off'): {workload} {variant:5s} = "
                     + ", ".join(f"{_paired(times[variant], times['off']):.3f}x {clock} (paired)"
                                 for clock, times in measured.items())
                     + f"; wall 95% interval of the paired median {low:.3f}x-{high:.3f}x")
    return "\n".join(lines)


def _paired(values: list[float], off: list[float]) -> float:
    """The median over rounds of each round's ratio to ``off`` in the same round (run right beside it, so a
    slow spell of a shared machine hits both alike)."""
    return statistics.median(value / base for value, base in zip(values, off))


def _paired_interval(values: list[float], off: list[float]) -> tuple[float, float]:
    """A distribution-free 95% confidence interval of the paired median: the order statistics of the rounds'
    ratios that the binomial distribution puts around it (the whole range below 6 rounds)."""
    ratios = sorted(value / base for value, base in zip(values, off))
    count = len(ratios)
    low = 0
    while low + 1 < count - low - 1 and math.fsum(math.comb(count, k) for k in range(low + 2)) / 2 ** count <= 0.025:
        low += 1
    return ratios[low], ratios[count - 1 - low]


def instruments_off_cost(root: Path, trial: str, repeats: int = 20000) -> float:
    """Seconds per training step of the recorder's calls into its instruments with nothing switched on."""
    recorder = ComgraRecorder(root, "bench", trial,
                              DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=1000),
                              resource_seconds=None)
    instruments = recorder.instruments
    start = time.process_time()
    for step in range(repeats):
        instruments.start_step(step, False)
        instruments.finish_step()
    cost = (time.process_time() - start) / repeats
    recorder.finalize()
    return cost


def resource_sample_cost(repeats: int = 200) -> float:
    """CPU seconds of one resource sample (what the sampler's thread does once per interval)."""
    import os

    import psutil

    from comgra.profiling.resources import GpuProbe, cpu_and_memory

    process, gpu = psutil.Process(os.getpid()), GpuProbe.open()
    start = time.process_time()
    for _ in range(repeats):
        cpu_and_memory(process) + gpu.sample()
    gpu.close()
    return (time.process_time() - start) / repeats


def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="a subset, e.g. off,on (more rounds in the same time); 'off' is always measured")
    args = parser.parse_args(arguments)
    variants = tuple(dict.fromkeys(["off", *args.variants.split(",")]))
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    torch.set_num_threads(1)
    native = native_marker.ensure_built()
    print(f"backward marker of 'on': {'C++ (native_marker)' if native else 'Python hook (the C++ marker could not be built)'}")
    print(f"time per training step: median and best of {args.rounds} rounds of {args.steps} steps of each variant, "
          "the variants interleaved step by step; ratios to 'off' (comgra on, profiling off)")
    with tempfile.TemporaryDirectory() as root:
        for workload in args.workloads.split(","):
            measured = measure(workload, args.rounds, args.steps, Path(root), variants)
            print(report(workload, measured), flush=True)
            step = statistics.median(measured["cpu"]["off"])
            off = instruments_off_cost(Path(root), f"instruments-off-{workload}")
            print(f"  profiling and sampling off: the instruments' per-step calls cost {off * 1e6:.2f} us of CPU "
                  f"per step = {off / step:.4%} of this workload's step", flush=True)
        sample = resource_sample_cost()
        print(f"resource sampling: one sample costs {sample * 1e6:.0f} us of CPU = {sample / 1.0:.4%} of a core "
              "at the default interval of 1 s", flush=True)


if __name__ == "__main__":
    main()

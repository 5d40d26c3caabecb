"""What the every-step sentinels on inputs cost (issue 32: zeroed inputs, labels, masks): the GPT-2 of the cost
breakdown (benchmarks/breakdown_workloads.py, 1 step in 10 recorded), trained by three copies interleaved block by
block in one process, the order rotating each round: plain (no comgra call), comgra with the sentinels on inputs
and targets (the default) and comgra with them off (``sentinels.inputs = False``: the losses and outputs only, as
before). ``--watch`` adds ``comgra.watch(model)`` to both comgra copies (the model's input_ids and labels go to the
sentinels through its pre-hook on every step; the copy with inputs off has that pre-hook removed, so the
difference is the whole input part).

Each block is timed on three clocks: wall, the process's CPU and the training thread's CPU (``thread_time``; torch
runs on ``--threads`` threads, 1 by default, so that the training thread's clock holds all of its work and a busy
shared machine disturbs it least). Prints the medians of the per-round ratios, and the sentinel part against plain
training: 1 + (inputs on - inputs off) / plain. ``--profile`` also times, on the training thread, every call of
the input path itself (``Sentinels.register`` for inputs and the watch's pre-hook) and prints it per step against
the plain step: the direct figure, which the machine's load cannot blur.

    python benchmarks/input_sentinel_cost.py --rounds 15 --block 10 [--watch] [--profile]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import breakdown_workloads as wl  # noqa: E402

CLOCKS = ("wall", "process CPU", "thread CPU")


def _block(trainer: wl.Trainer, batches: list) -> tuple[float, float, float]:
    wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
    for batch in batches:
        trainer.step(batch)
    return time.perf_counter() - wall, time.process_time() - cpu, time.thread_time() - thread


class _Timed:
    """Wraps the input path's calls and adds up their training-thread CPU time (the wrapper's own cost included)."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def wrap(self, function: Any, only_inputs: bool = False) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if only_inputs and not (kwargs.get("is_input") or (len(args) > 3 and args[3])):
                return function(*args, **kwargs)
            start = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - start
                self.calls += 1
        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block", type=int, default=10, help="steps per block (a multiple of 10)")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    parser.add_argument("--watch", action="store_true")
    parser.add_argument("--profile", action="store_true", help="time the input path's calls directly")
    args = parser.parse_args()
    import torch

    import comgra
    torch.set_num_threads(args.threads)
    workload = wl.WORKLOADS["gpt2"]
    load = os.getloadavg()
    timer = _Timed()
    with tempfile.TemporaryDirectory() as root:
        trainers = {"plain": wl.Trainer(workload, None)}
        for name, inputs in (("inputs_on", True), ("inputs_off", False)):
            recorder = wl.make_recorder(Path(root), f"gpt2_{name}", f"every{workload.every}")
            trainers[name] = wl.Trainer(workload, recorder)
            trainers[name].model.load_state_dict(trainers["plain"].model.state_dict())
            sentinels = recorder._evidence.sentinels
            sentinels.inputs = inputs
            if args.watch:
                watch = comgra.watch(trainers[name].model, recorder=recorder, name="model")
                if not inputs:  # the whole input part off: no pre-hook on the model either
                    watch._sentinel_handle.remove()
                    watch._sentinel_handle = None
                elif args.profile:
                    watch._sentinel_handle.remove()
                    watch._sentinel_handle = trainers[name].model.register_forward_pre_hook(
                        timer.wrap(watch._sentinel_hook), with_kwargs=True)
            if inputs and args.profile:
                sentinels.register = timer.wrap(sentinels.register, only_inputs=True)
        batches = [workload.batch(step) for step in range(args.block)]
        order = list(trainers)
        for name in order * 2:  # warm-up
            _block(trainers[name], batches)
        timer.seconds, timer.calls = 0.0, 0
        times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in order}
        for round_ in range(args.rounds):
            rotated = order[round_ % 3:] + order[:round_ % 3]
            for name in rotated:
                times[name].append(_block(trainers[name], batches))
        for name in ("inputs_on", "inputs_off"):
            trainers[name].recorder.finalize()
    steps = args.rounds * args.block
    print(f"GPT-2 (4 layers, 256), 1 in {workload.every} recorded, {args.rounds} rounds of {args.block} steps, "
          f"{args.threads} torch thread(s){', comgra.watch' if args.watch else ''}; load average before "
          f"{load[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    plain = [statistics.median(t[i] for t in times["plain"]) / args.block * 1e3 for i in range(3)]
    print("plain step (median ms): " + ", ".join(f"{c} {v:.1f}" for c, v in zip(CLOCKS, plain)))
    for index, clock in enumerate(CLOCKS):
        on = [a[index] / p[index] for a, p in zip(times["inputs_on"], times["plain"])]
        off = [a[index] / p[index] for a, p in zip(times["inputs_off"], times["plain"])]
        part = [1 + (a[index] - b[index]) / p[index] for a, b, p in
                zip(times["inputs_on"], times["inputs_off"], times["plain"])]
        print(f"{clock:12s} inputs on / plain {statistics.median(on):.4f}   inputs off / plain "
              f"{statistics.median(off):.4f}   sentinel part on inputs vs plain {statistics.median(part):.4f} "
              f"(lowest {min(part):.4f}, highest {max(part):.4f})")
    if args.profile:
        per_step = timer.seconds / steps * 1e6
        print(f"input path, timed directly on the training thread: {per_step:.1f} us per step ({timer.calls} calls "
              f"in {steps} steps) = {1 + per_step / 1e3 / plain[2]:.5f}x the plain step's thread CPU")


if __name__ == "__main__":
    main()

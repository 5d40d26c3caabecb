"""What the every-step sentinels on inputs cost (issue 32: zeroed inputs, labels, masks): the GPT-2 of the cost
breakdown (benchmarks/breakdown_workloads.py, 1 step in 10 recorded), trained by three copies interleaved block by
block in one process, the order rotating each round: plain (no comgra call), comgra with the sentinels on inputs
and targets (the default) and comgra with them off (``sentinels.inputs = False``: the losses and outputs only, as
before). ``--watch`` adds ``comgra.watch(model)`` to both comgra copies (the model's input_ids and labels go to the
sentinels through its pre-hook on every step). Prints the medians of the ratios on the wall clock and on the
process's CPU clock, and the sentinel part against plain training: 1 + (inputs on - inputs off) / plain.

    python benchmarks/input_sentinel_cost.py --rounds 9 [--watch]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import breakdown_workloads as wl  # noqa: E402


def _block(trainer: wl.Trainer, batches: list) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
        trainer.step(batch)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--block", type=int, default=20, help="steps per block (a multiple of 10)")
    parser.add_argument("--watch", action="store_true")
    args = parser.parse_args()
    import comgra
    workload = wl.WORKLOADS["gpt2"]
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as root:
        trainers = {"plain": wl.Trainer(workload, None)}
        for name, inputs in (("inputs_on", True), ("inputs_off", False)):
            recorder = wl.make_recorder(Path(root), f"gpt2_{name}", f"every{workload.every}")
            trainers[name] = wl.Trainer(workload, recorder)
            trainers[name].model.load_state_dict(trainers["plain"].model.state_dict())
            recorder._evidence.sentinels.inputs = inputs
            if args.watch:
                comgra.watch(trainers[name].model, recorder=recorder, name="model")
        batches = [workload.batch(step) for step in range(args.block)]
        order = list(trainers)
        for name in order * 2:  # warm-up
            _block(trainers[name], batches)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in order}
        for round_ in range(args.rounds):
            rotated = order[round_ % 3:] + order[:round_ % 3]
            for name in rotated:
                times[name].append(_block(trainers[name], batches))
        for name in ("inputs_on", "inputs_off"):
            trainers[name].recorder.finalize()
    print(f"GPT-2 (4 layers, 256), 1 in {workload.every} recorded, {args.rounds} rounds of {args.block} steps"
          f"{', comgra.watch' if args.watch else ''}; load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    plain_ms = statistics.median(t[0] for t in times["plain"]) / args.block * 1e3
    print(f"plain step: {plain_ms:.1f} ms (wall, median)")
    for clock, index in (("wall", 0), ("process CPU", 1)):
        on = [a[index] / p[index] for a, p in zip(times["inputs_on"], times["plain"])]
        off = [a[index] / p[index] for a, p in zip(times["inputs_off"], times["plain"])]
        part = [1 + (a[index] - b[index]) / p[index] for a, b, p in
                zip(times["inputs_on"], times["inputs_off"], times["plain"])]
        print(f"{clock:12s} inputs on / plain {statistics.median(on):.4f}   inputs off / plain "
              f"{statistics.median(off):.4f}   sentinel part on inputs vs plain {statistics.median(part):.4f} "
              f"(lowest {min(part):.4f}, highest {max(part):.4f})")


if __name__ == "__main__":
    main()

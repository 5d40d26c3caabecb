"""The tiny MLP's fixed costs (issue 34): a recorded step's and an unrecorded step's extra CPU on the training thread,
a reference commit and the current tree measured at the same time, so that a busy machine disturbs both alike.

    python benchmarks/mlp_fixed_cost.py --ref 0765a8d          # the reference's src against this tree's
    python benchmarks/mlp_fixed_cost.py --ref main --rounds 400

Two child processes start together, one per side (the reference checked out with ``git worktree add --detach``
into a temporary folder, as benchmarks/regression.py does). Each trains three copies of the MLP 64-4x256-10
(batch 64; benchmarks/breakdown_workloads.py): plain (no comgra call), every step recorded, and no step recorded
(the recorder active). Round after round it runs a short block of each, plain between the two others, on the
training thread's CPU clock (``time.thread_time``), and keeps per round the recorded and the unrecorded block's
extra over the plain blocks beside it, per step. On a shared machine other processes only ever add time, in bursts:
the table gives percentiles of the rounds (10th, 25th, median), the low ones being the least disturbed. Each
child's plain step is printed too: compare sides only where their plain steps agree. Then the process's CPU clock
(every thread: the writer's work too, which a 2-core machine pays) and the wall clock, over 300-step blocks each
ended by a flush, so that the writer's work for a block is done inside it.
"""
from __future__ import annotations

import argparse
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


def child(rounds: int, block: int, long_rounds: int = 5, long_block: int = 300) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    import breakdown_workloads as wl
    wl.setup_process()
    workload = wl.WORKLOADS["mlp"]
    with tempfile.TemporaryDirectory() as folder:
        trainers = {"plain": wl.Trainer(workload, None)}
        recorders = {mode: wl.make_recorder(Path(folder), f"fixed_{mode}", mode) for mode in ("every1", "never")}
        trainers.update({mode: wl.Trainer(workload, recorder) for mode, recorder in recorders.items()})
        batches = [workload.batch(step) for step in range(block)]

        def run(name: str) -> float:
            start = time.thread_time()
            for batch in batches:
                trainers[name].step(batch)
            return (time.thread_time() - start) / block * 1e3
        for _ in range(3):  # warm-up: the first recorded steps, the kernels
            for name in trainers:
                run(name)
        found: dict[str, list[float]] = {"recorded": [], "unrecorded": [], "plain": []}
        for _ in range(rounds):
            first, recorded, second, unrecorded, third = (run("plain"), run("every1"), run("plain"), run("never"),
                                                          run("plain"))
            found["recorded"].append(recorded - (first + second) / 2)
            found["unrecorded"].append(unrecorded - (second + third) / 2)
            found["plain"].append(second)
        # The process's CPU (every thread: the writer's work, which a 2-core machine pays too) and the wall clock, over
        # long blocks each ended by a flush (the writer's work for them done inside the block: short blocks would hand
        # it to the next one), about what the writer's own cadence (every 2 s) does.
        long_batches = [workload.batch(step) for step in range(long_block)]

        def run_long(name: str) -> tuple[float, float]:
            start, wall = time.process_time(), time.perf_counter()
            for batch in long_batches:
                trainers[name].step(batch)
            if name in recorders:
                recorders[name].flush()
            return ((time.process_time() - start) / long_block * 1e3, (time.perf_counter() - wall) / long_block * 1e3)
        for _ in range(long_rounds):
            first_long, recorded_long, second_long = run_long("plain"), run_long("every1"), run_long("plain")
            for index, clock in enumerate(("process", "wall")):
                found.setdefault(f"{clock}_recorded", []).append(
                    recorded_long[index] - (first_long[index] + second_long[index]) / 2)
                found.setdefault(f"{clock}_plain", []).append(second_long[index])
        for recorder in recorders.values():
            recorder.finalize()
    import comgra
    return {"found": found, "comgra_file": comgra.__file__}


def _percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    cut = statistics.quantiles(ordered, n=20)  # 5% steps
    return f"{cut[1]:+7.3f} {cut[4]:+7.3f} {statistics.median(ordered):+7.3f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", default="main~1", help="the reference commit (any git revision)")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--block", type=int, default=5, help="steps per block")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        print("RESULT " + json.dumps(child(options.rounds, options.block)))
        return
    print(f"reference {options.ref} against the current tree; load average before: {os.getloadavg()[0]:.2f}; "
          f"{options.rounds} rounds of {options.block}-step blocks per side, both sides at the same time")
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "reference"
        subprocess.run(["git", "-C", str(REPOSITORY), "worktree", "add", "--detach", str(target), options.ref],
                       check=True, capture_output=True, text=True)
        try:
            processes = {side: subprocess.Popen(
                [sys.executable, str(HERE / "mlp_fixed_cost.py"), "--child", "--rounds", str(options.rounds),
                 "--block", str(options.block)], env=dict(os.environ, PYTHONPATH=str(source / "src")),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for side, source in (("ref", target), ("now", REPOSITORY))}
            results = {}
            for side, process in processes.items():
                out, err = process.communicate()
                lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
                if process.returncode != 0 or not lines:
                    raise RuntimeError(f"{side} failed:\n{out[-2000:]}\n{err[-4000:]}")
                results[side] = json.loads(lines[-1][len("RESULT "):])
        finally:
            subprocess.run(["git", "-C", str(REPOSITORY), "worktree", "remove", "--force", str(target)],
                           capture_output=True, text=True)
    print("\ntraining thread CPU, ms per step; percentiles of the rounds: 10th 25th median")
    print(f"  {'side':<6}{'plain step':<26}{'recorded step: extra':<26}{'unrecorded step: extra':<26}")
    for side in ("ref", "now"):
        found = results[side]["found"]
        print(f"  {side:<6}{_percentiles(found['plain']):<26}{_percentiles(found['recorded']):<26}"
              f"{_percentiles(found['unrecorded']):<26}")
    print("\nprocess CPU (all threads) and wall clock, 300-step blocks each ended by a flush, ms per step; lowest and "
          "median of the rounds")
    print(f"  {'side':<6}{'plain: process':<18}{'recorded extra: process':<26}{'plain: wall':<18}{'recorded extra: wall'}")
    for side in ("ref", "now"):
        found = results[side]["found"]
        cells = [f"{min(found[key]):+7.3f} {statistics.median(found[key]):+7.3f}"
                 for key in ("process_plain", "process_recorded", "wall_plain", "wall_recorded")]
        print(f"  {side:<6}{cells[0]:<18}{cells[1]:<26}{cells[2]:<18}{cells[3]}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

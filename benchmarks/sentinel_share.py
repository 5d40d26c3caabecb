"""How much of the tiny MLP's unrecorded step (issue 34: at most +0.05 ms) the every-step sentinels take: three copies
of the MLP 64-4x256-10 (batch 64; benchmarks/breakdown_workloads.py) in one process, trained in interleaved blocks:
plain (no comgra call), comgra with no step recorded and the sentinels on (the default), and the same with them off
(``set_sentinels(enabled=False)``). Per round, each comgra block's extra over the plain blocks beside it, per step, on
the training thread's CPU clock; prints the 10th, 25th percentile and median of the rounds, and the load average.

    python benchmarks/sentinel_share.py --rounds 200
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--block", type=int, default=20, help="steps per block")
    options = parser.parse_args(argv)
    wl.setup_process()
    workload = wl.WORKLOADS["mlp"]
    print(f"load average before: {os.getloadavg()[0]:.2f}; {options.rounds} rounds of {options.block}-step blocks")
    with tempfile.TemporaryDirectory() as folder:
        on = wl.make_recorder(Path(folder), "sentinels_on", "never")
        off = wl.make_recorder(Path(folder), "sentinels_off", "never")
        off.set_sentinels(enabled=False)
        trainers = {"plain": wl.Trainer(workload, None), "on": wl.Trainer(workload, on), "off": wl.Trainer(workload, off)}
        batches = [workload.batch(step) for step in range(options.block)]

        def run(name: str) -> float:
            start = time.thread_time()
            for batch in batches:
                trainers[name].step(batch)
            return (time.thread_time() - start) / len(batches) * 1e6
        for _ in range(3):  # warm-up
            for name in trainers:
                run(name)
        found: dict[str, list[float]] = {"on": [], "off": []}
        for _ in range(options.rounds):
            first, with_them, second, without, third = run("plain"), run("on"), run("plain"), run("off"), run("plain")
            found["on"].append(with_them - (first + second) / 2)
            found["off"].append(without - (second + third) / 2)
        on.finalize()
        off.finalize()
    print("comgra's extra per unrecorded step, us of training-thread CPU (10th percentile, 25th, median of the rounds)")
    for name, label in (("on", "sentinels on (default)"), ("off", "sentinels off")):
        values = sorted(found[name])
        deciles, quartiles = statistics.quantiles(values, n=10), statistics.quantiles(values, n=4)
        print(f"  {label:<24}{deciles[0]:+8.1f} {quartiles[0]:+8.1f} {statistics.median(values):+8.1f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""What profiling the layers costs ``comgra demo``'s recording: the tutorial run as the demo records it, with
``profile`` off and on, alternating in fresh processes (so that the machine's load hits both alike).

    python benchmarks/demo_profile_cost.py [--rounds 3] [--steps 300]

Each run is ``comgra.examples.tutorial.run_tutorial`` with the demo's settings (``--steps`` per trial, a
recorded step of each type at most every ``steps * 2 // 5`` steps) in a new interpreter; it times the call
alone (the imports excluded): wall time and the process's CPU time, and the size of what was written. It
prints the medians, their ratio, and the load average before and after.
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

CHILD = """
import json, sys, time
from pathlib import Path
from comgra.examples.tutorial import run_tutorial
root, steps, profile = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "on"
wall, cpu = time.perf_counter(), time.process_time()
group = run_tutorial(root, "demo", steps=steps, min_training_steps_difference=max(1, steps * 2 // 5),
                     progress=False, profile=profile)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
size = sum(f.stat().st_size for f in group.rglob("*") if f.is_file())
layers = sum(f.stat().st_size for f in group.rglob("*") if f.is_file() and "layers" in f.parts)
print(json.dumps({"wall": wall, "cpu": cpu, "bytes": size, "layer bytes": layers}))
"""


def run_once(steps: int, profile: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="comgra-demo-cost-") as root:
        out = subprocess.run([sys.executable, "-c", CHILD, root, str(steps), "on" if profile else "off"],
                             check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="training steps per trial (comgra demo's default: 300)")
    args = parser.parse_args(argv)
    print(f"# {time.strftime('%H:%M:%S', time.gmtime())} UTC, load average {os.getloadavg()}", flush=True)
    runs: dict[str, list[dict[str, float]]] = {"profile off": [], "profile on": []}
    for round_ in range(args.rounds):
        order = ["profile off", "profile on"] if round_ % 2 == 0 else ["profile on", "profile off"]
        for label in order:
            runs[label].append(run_once(args.steps, label == "profile on"))
            print(f"# round {round_ + 1} {label}: {runs[label][-1]}", flush=True)
    print(f"\n{args.steps} steps per trial, 2 trials, {args.rounds} rounds alternating; medians (min-max)")
    print("| measurement | profile off | profile on | ratio |\n|---|---|---|---|")
    for key, unit, scale in [("wall", "s", 1), ("cpu", "CPU-s", 1), ("bytes", "KiB", 1 / 1024),
                             ("layer bytes", "KiB", 1 / 1024)]:
        off, on = ([r[key] * scale for r in runs[label]] for label in runs)
        a, b = statistics.median(off), statistics.median(on)
        print(f"| {key} ({unit}) | {a:.2f} ({min(off):.2f}-{max(off):.2f}) | {b:.2f} ({min(on):.2f}-{max(on):.2f}) | "
              f"{b / a if a else float('nan'):.2f} |")
    print(f"# ended {time.strftime('%H:%M:%S', time.gmtime())} UTC, load average {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

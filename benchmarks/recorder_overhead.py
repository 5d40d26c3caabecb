"""Recording cost, measured side by side in one run: ours against no comgra, and against the original.

Every measurement runs in a fresh process (benchmarks/recording_workloads.py) and the modes are
interleaved round by round, so drift on a noisy machine hits them alike. Prints a table of ratios.

    python benchmarks/recorder_overhead.py [--original-python /path/to/venv-with-comgra-0.11.5/bin/python]

Figures:
  * overhead: time with the recorder present but comgra_is_active=False, and recording on the
    tutorial's schedule (FrequencyPerType(min_training_steps_difference=1000)), over no comgra;
  * one recorded step: (time recording every step - time without comgra) / steps, and bytes on disk
    per recorded step, ours against the original 0.11.5 on the same workload.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOAD_SCRIPT = HERE / "recording_workloads.py"


def run(python: str, workload: str, mode: str, steps: int, out: Path) -> dict:
    command = [python, str(WORKLOAD_SCRIPT), "--workload", workload, "--mode", mode,
               "--steps", str(steps), "--out", str(out)]
    completed = subprocess.run(command, capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    return json.loads(completed.stdout.strip().splitlines()[-1])


def overhead(python: str, workload: str, steps: int, rounds: int, out: Path) -> dict[str, float]:
    times: dict[str, list[float]] = {"none": [], "inactive": [], "schedule": []}
    for _ in range(rounds):
        for mode in times:
            times[mode].append(run(python, workload, mode, steps, out)["seconds"])
    base = statistics.median(times["none"])
    return {mode: statistics.median(values) / base for mode, values in times.items()} | {"base_s": base}


def per_recorded_step(python: str, workload: str, steps: int, rounds: int, out: Path) -> dict[str, float]:
    none, recorded, size = [], [], 0.0
    for _ in range(rounds):
        none.append(run(python, workload, "none", steps, out)["seconds"])
        result = run(python, workload, "all", steps, out)
        recorded.append(result["seconds"])
        size = result["bytes"] / max(1, result["recorded_steps"])
    cost = (statistics.median(recorded) - statistics.median(none)) / steps
    return {"seconds_per_recorded_step": cost, "bytes_per_recorded_step": size}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--original-python", help="python of a venv with comgra==0.11.5 (and torch)")
    parser.add_argument("--steps", type=int, default=2000,
                        help="training steps per overhead measurement (2000: as in the 20000-step tutorial, about 1.2%% of steps get recorded)")
    parser.add_argument("--recorded-steps", type=int, default=40,
                        help="steps per recorded-step measurement (enough to spread one-time costs)")
    parser.add_argument("--parts", default="overhead,recorded", help="which tables to print: overhead,recorded")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    ours = sys.executable
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        if "overhead" in args.parts:
            print(f"{'workload':<12}{'inactive/none':>15}{'schedule/none':>15}{'none s':>9}")
            for workload in ("tutorial", "transformer"):
                o = overhead(ours, workload, args.steps, args.rounds, out)
                print(f"{workload:<12}{o['inactive']:>15.3f}{o['schedule']:>15.3f}{o['base_s']:>9.2f}")
            print()
        if "recorded" not in args.parts:
            return
        print(f"{'workload':<12}{'impl':<10}{'ms/recorded step':>18}{'KiB/recorded step':>19}")
        for workload in ("tutorial", "transformer"):
            rows = {"ours": per_recorded_step(ours, workload, args.recorded_steps, args.rounds, out)}
            if args.original_python:
                rows["original"] = per_recorded_step(args.original_python, workload, args.recorded_steps, 1, out)
            for impl, row in rows.items():
                print(f"{workload:<12}{impl:<10}{row['seconds_per_recorded_step'] * 1e3:>18.1f}"
                      f"{row['bytes_per_recorded_step'] / 1024:>19.1f}")
            if "original" in rows:
                time_ratio = rows["original"]["seconds_per_recorded_step"] / rows["ours"]["seconds_per_recorded_step"]
                size_ratio = rows["original"]["bytes_per_recorded_step"] / rows["ours"]["bytes_per_recorded_step"]
                print(f"{workload:<12}{'ratio':<10}{time_ratio:>17.1f}x{size_ratio:>18.1f}x  (original / ours)")


if __name__ == "__main__":
    main()

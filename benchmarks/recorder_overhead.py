"""Recording cost, measured side by side in one run: ours against no comgra, and against the original.

Every measurement runs in a fresh process (benchmarks/recording_workloads.py) and the modes are
interleaved round by round, so drift on a noisy machine hits them alike. Each figure is the median
over the rounds, with the spread (lowest-highest) of the rounds beside it.

    python benchmarks/recorder_overhead.py [--original-python /path/to/venv-with-comgra-0.11.5/bin/python]

Figures (--parts, any of overhead,recorded,sparse,within,calls):
  * recorded: one recorded step, (time recording every step - time without comgra) / steps, and
    bytes on disk per recorded step, ours against the original 0.11.5 on the same workload, side by
    side with the ratio;
  * sparse: training time recording 1 step in 10 (FrequencyPerType(min_training_steps_difference=10))
    over the same training without comgra, ours and the original: a ratio with its 95% interval over
    paired rounds of longer runs, and where the extra time goes (benchmarks/sparse_overhead.py, which
    prints the same table on its own; --sparse-steps sets the run's length);
  * within: the same ratio inside one process, blocks with and without comgra in turn (the steady state;
    far narrower intervals on a noisy machine);
  * calls: the recorder's calls on a step the policy does not record, microseconds per call;
  * overhead: time with the recorder present but comgra_is_active=False, and recording on the
    tutorial's schedule (FrequencyPerType(min_training_steps_difference=1000)), over no comgra.

Where a recorded step's time goes, part by part on each thread's CPU clock: benchmarks/recorder_parts.py.

Workloads: the tutorial's recurrent net, a small transformer, a ResNet-18 (11.2M parameters in 62
tensors, ReLU(inplace=True) and ``out += identity`` after registered BatchNorm outputs) and a
nanoGPT-shaped model (tied lm_head/wte). The conv maps and (B, T, C) activations are registered with
recording_type='kpis' on both: the original crashes on tensors with 3 or more non-batch dimensions
under 'neuron', and spends minutes per step on every neuron of a (B, T, C) tensor.
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
sys.path.insert(0, str(HERE))
import sparse_overhead  # noqa: E402  (the sparse table and the calls on unrecorded steps)

WORKLOAD_SCRIPT = HERE / "recording_workloads.py"
WORKLOADS = ("tutorial", "transformer", "resnet18", "gpt")
# Steps per measurement: enough recorded steps to spread one-time costs, runs of 10-60 s each.
RECORDED_STEPS = {"tutorial": 40, "transformer": 40, "resnet18": 30, "gpt": 30}
# Issue 6: one recorded step at most this fraction of the original's, on the wall clock.
RECORDED_STEP_TARGETS = {"resnet18": 0.10}


def run(python: str, workload: str, mode: str, steps: int, out: Path, schedule_gap: int = 1000) -> dict:
    command = [python, str(WORKLOAD_SCRIPT), "--workload", workload, "--mode", mode,
               "--steps", str(steps), "--out", str(out), "--schedule-gap", str(schedule_gap)]
    completed = subprocess.run(command, capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    return json.loads(completed.stdout.strip().splitlines()[-1])


def spread(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    return f"{min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f}"


def overhead(python: str, workload: str, steps: int, rounds: int, out: Path) -> dict[str, float]:
    times: dict[str, list[float]] = {"none": [], "inactive": [], "schedule": []}
    for _ in range(rounds):
        for mode in times:
            times[mode].append(run(python, workload, mode, steps, out)["seconds"])
    base = statistics.median(times["none"])
    return {mode: statistics.median(values) / base for mode, values in times.items()} | {"base_s": base}


# Clocks (--clocks): wall time; CPU time of every thread of the process, which other processes on a
# shared machine disturb far less than the wall time; CPU time of the training thread alone, which is
# the wall time on a machine with a core free for comgra's worker thread.
CLOCKS = {"wall": "seconds", "cpu": "cpu_seconds", "main": "main_seconds"}


def paired_runs(pythons: dict[str, str], workload: str, steps: int, rounds: int, out: Path, mode: str,
                schedule_gap: int = 1000):
    """Per round and implementation, a run without comgra and one in ``mode``, back to back: yields
    (implementation, run without comgra, run in mode)."""
    for _ in range(rounds):
        for impl, python in pythons.items():
            none = run(python, workload, "none", steps, out)
            yield impl, none, run(python, workload, mode, steps, out, schedule_gap=schedule_gap)


def per_recorded_step(pythons: dict[str, str], workload: str, steps: int, rounds: int, out: Path,
                      clocks: list[str] = ["wall"]) -> dict:
    """Per implementation and clock: the cost of one recorded step in every round; bytes per recorded step."""
    costs: dict[str, dict[str, list[float]]] = {impl: {c: [] for c in clocks} for impl in pythons}
    size: dict[str, float] = {}
    for impl, none, result in paired_runs(pythons, workload, steps, rounds, out, "all"):
        for clock in clocks:
            costs[impl][clock].append((result[CLOCKS[clock]] - none[CLOCKS[clock]]) / steps)
        size[impl] = result["bytes"] / max(1, result["recorded_steps"])
    return {impl: {"costs": costs[impl], "bytes": size[impl]} for impl in pythons}


def print_recorded(pythons: dict[str, str], workloads: list[str], rounds: int, out: Path,
                   clocks: list[str] = ["wall"]) -> None:
    print(f"one recorded step, median over {rounds} rounds (spread)")
    print(f"{'workload':<12}{'clock':<6}{'impl':<10}{'ms/recorded step':>17}{'spread':>17}{'KiB/recorded step':>19}")
    for workload in workloads:
        rows = per_recorded_step(pythons, workload, RECORDED_STEPS[workload], rounds, out, clocks)
        for clock in clocks:
            for impl, row in rows.items():
                costs = row["costs"][clock]
                print(f"{workload:<12}{clock:<6}{impl:<10}{statistics.median(costs) * 1e3:>17.1f}"
                      f"{spread(costs, 1e3):>17}{row['bytes'] / 1024:>19.1f}")
            for impl in [i for i in rows if i != "original"] if "original" in rows else []:
                ours, original = rows[impl], rows["original"]
                time_ratio = statistics.median(ours["costs"][clock]) / statistics.median(original["costs"][clock])
                label = "ours/orig" if impl == "ours" else f"{impl[:5]}/orig"
                verdict = ""
                if clock == "wall" and workload in RECORDED_STEP_TARGETS:
                    target = RECORDED_STEP_TARGETS[workload]
                    verdict = f"   target <= {target:.2f}x: {'met' if time_ratio <= target else 'NOT met'}"
                print(f"{workload:<12}{clock:<6}{label:<10}{time_ratio:>16.3f}x{'':>17}"
                      f"{ours['bytes'] / original['bytes']:>18.3f}x{verdict}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--original-python", help="python of a venv with comgra==0.11.5 (and torch)")
    parser.add_argument("--before-python",
                        help="python that imports an earlier comgra of ours (e.g. PYTHONPATH=old/src): measured "
                             "side by side as 'before', for an A/B of a change in the same run")
    parser.add_argument("--before-label", default="before",
                        help="the name of --before-python in the tables, e.g. 'nohelper' for a python wrapper that "
                             "sets COMGRA_KERNEL_HELPER=0")
    parser.add_argument("--steps", type=int, default=2000,
                        help="training steps per overhead measurement (2000: as in the 20000-step tutorial, about 1.2%% of steps get recorded)")
    parser.add_argument("--parts", default="overhead,recorded,sparse", help="which tables to print")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="for the recorded and sparse tables")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sparse-steps", type=int,
                        help=f"steps per run of the sparse table (default: {sparse_overhead.STEPS})")
    parser.add_argument("--clocks", default="wall",
                        help="for the recorded and sparse tables, any of wall,cpu,main (see CLOCKS)")
    args = parser.parse_args(argv)
    import sys
    pythons = {"ours": sys.executable}
    if args.before_python:
        pythons[args.before_label] = args.before_python
    if args.original_python:
        pythons["original"] = args.original_python
    workloads = [w for w in args.workloads.split(",") if w]
    clocks = [c for c in args.clocks.split(",") if c]
    unknown = set(clocks) - set(CLOCKS)
    if unknown:
        parser.error(f"--clocks: unknown {sorted(unknown)}; choose from {sorted(CLOCKS)}")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        if "overhead" in args.parts:
            print(f"{'workload':<12}{'inactive/none':>15}{'schedule/none':>15}{'none s':>9}")
            for workload in ("tutorial", "transformer"):
                o = overhead(sys.executable, workload, args.steps, args.rounds, out)
                print(f"{workload:<12}{o['inactive']:>15.3f}{o['schedule']:>15.3f}{o['base_s']:>9.2f}", flush=True)
            print()
        if "recorded" in args.parts:
            print_recorded(pythons, workloads, args.rounds, out, clocks)
            print()
        if "sparse" in args.parts:
            sparse_overhead.print_sparse(pythons, workloads, args.rounds, out, clocks, args.sparse_steps)
        if "within" in args.parts:
            for workload in workloads:
                sparse_overhead.print_within(pythons, workload, args.sparse_steps or sparse_overhead.STEPS[workload],
                                             args.rounds, out)
        if "calls" in args.parts:
            sparse_overhead.print_calls()


if __name__ == "__main__":
    main()

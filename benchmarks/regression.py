"""Keep it won (issue 34): the previous landed commit and the current tree, side by side in one run, on the
workloads of benchmarks/breakdown_workloads.py; prints a table of ratios.

    python benchmarks/regression.py                       # against main~1 (the commit before the last merge)
    python benchmarks/regression.py --ref main --workload mlp conv --rounds 5
    python benchmarks/regression.py --workload --app       # the app alone: node clicks and the first page

The reference commit is checked out with ``git worktree add --detach`` into a temporary folder (removed
afterwards). Each measurement is a child process that runs this tree's workload code against one side's
``src`` (the workloads use the documented API only, so an older commit runs them unchanged): inside it, a
plain copy of the model and a recorded copy train in interleaved blocks (benchmarks/cost_breakdown.py's
``ratios``), giving comgra's cost as a ratio to plain training measured in the same process. The sides
alternate child by child (ref, current, current, ref, ...), so that the machine's drift hits both alike.

Per workload and mode the table shows, for each side, the median over the children of the ratio to plain
training on the training thread's CPU clock (``time.thread_time``: what other processes on a shared machine
disturb least) and on the wall clock, with comgra's extra milliseconds per step, and last the current
side's ratio over the reference side's (below 1: faster now). The load average is printed before and after.
Run it before a change to capture/, breakpoints/, store/ or the server lands; no unit test holds a timing bound.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent
DEFAULT_MODES = {"conv": ["every10"], "attention": ["every50", "inactive"], "mlp": ["every10", "every1", "never"],
                 "gpt_compiled": ["every10"], "gpt2": ["every10"]}


def child(arguments: argparse.Namespace) -> None:
    """One measurement, printed as one JSON line (the parent set PYTHONPATH to the side's src)."""
    sys.path.insert(0, str(HERE))
    import breakdown_workloads as wl
    import cost_breakdown
    wl.setup_process()
    workload = wl.WORKLOADS[arguments.workload]
    gap = int(arguments.mode[5:]) if arguments.mode.startswith("every") else 10
    with tempfile.TemporaryDirectory() as folder:
        found = cost_breakdown.ratios(workload, arguments.mode, arguments.child_rounds,
                                      cost_breakdown.block_steps(gap, arguments.blocks),
                                      Path(folder))
        if arguments.mode in ("every1", "never"):  # what runs per step, counted: the same at any load
            found["calls"] = cost_breakdown.calls_per_step(workload, arguments.mode, Path(folder))
    import comgra
    found["comgra_file"] = comgra.__file__
    print("RESULT " + json.dumps(found))


def _run_side(source: Path, workload: str, mode: str, options: argparse.Namespace) -> dict[str, Any]:
    environment = dict(os.environ, PYTHONPATH=str(source / "src"))
    command = [sys.executable, str(HERE / "regression.py"), "--child", "--workload", workload, "--mode", mode,
               "--child-rounds", str(options.child_rounds), "--blocks", str(options.blocks)]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=options.timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{workload} {mode} on {source} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    found = json.loads(lines[-1][len("RESULT "):])
    expected = str((source / "src").resolve())
    if not str(Path(found["comgra_file"]).resolve()).startswith(expected):
        raise RuntimeError(f"the child imported comgra from {found['comgra_file']}, not from {expected}")
    return found


def _worktree(ref: str, folder: Path) -> Path:
    target = folder / "reference"
    subprocess.run(["git", "-C", str(REPOSITORY), "worktree", "add", "--detach", str(target), ref], check=True,
                   capture_output=True, text=True)
    return target


def _app(reference: Path, folder: Path, options: argparse.Namespace) -> None:
    """benchmarks/app_latency.py of this tree, with the reference's src as its baseline: its table, as it prints it."""
    command = [sys.executable, str(HERE / "app_latency.py"), "--baseline-src", str(reference / "src"), "--nodes", "15",
               "--nodes", "1000", "--scale", "1", "--repeats", str(options.app_repeats), "--no-rss",
               "--out", str(folder / "app")]
    print("\napp: " + " ".join(command[1:]), flush=True)
    subprocess.run(command, env=dict(os.environ, PYTHONPATH=str(REPOSITORY / "src")), check=False)


def _cell(results: list[dict[str, Any]], clock: str) -> str:
    ratios = [r[clock][0] for r in results]
    extra = statistics.median(r[f"{clock}_ms_per_step"][0] for r in results)
    floor = statistics.median(r.get(f"{clock}_floor_ms", math.nan) for r in results)
    return f"{statistics.median(ratios):6.3f}x ({min(ratios):.2f}-{max(ratios):.2f}) {extra:+7.3f}ms {floor:+7.3f}ms"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", default="main~1", help="the reference commit (any git revision)")
    parser.add_argument("--workload", nargs="*", choices=sorted(DEFAULT_MODES), default=["mlp", "conv", "attention",
                                                                                          "gpt2", "gpt_compiled"])
    parser.add_argument("--rounds", type=int, default=3, help="child processes per side, workload and mode")
    parser.add_argument("--child-rounds", type=int, default=5, help="interleaved rounds inside each child")
    parser.add_argument("--blocks", type=int, default=1, help="policy gaps per block")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per child")
    parser.add_argument("--app", action="store_true",
                        help="also the app in the browser (benchmarks/app_latency.py --baseline-src: node clicks, "
                             "first page, 15 and 1,000 nodes), the reference's server right before this tree's")
    parser.add_argument("--app-repeats", type=int, default=15)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="every10", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        options.workload = options.workload[0]
        child(options)
        return
    commit = subprocess.run(["git", "-C", str(REPOSITORY), "rev-parse", "--short", options.ref], check=True,
                            capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(REPOSITORY), "rev-parse", "--short", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    print(f"reference {options.ref} ({commit}) against the current tree (HEAD {head} and its uncommitted changes); "
          f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{options.rounds} child processes per side, each {options.child_rounds} interleaved rounds of plain and "
          "recorded blocks; ratio to plain training: median (lowest-highest), comgra's extra ms per step (median), and "
          "the same from each side's least disturbed block (floor)")
    with tempfile.TemporaryDirectory() as folder:
        reference = _worktree(options.ref, Path(folder))
        try:
            sides = {"ref": reference, "now": REPOSITORY}
            if options.workload:
                print(f"\n{'workload':<13}{'mode':<10}{'side':<5}{'training thread CPU':<45}{'wall clock':<45}")
            rows = []
            for workload in options.workload:
                for mode in DEFAULT_MODES[workload]:
                    results: dict[str, list[dict[str, Any]]] = {"ref": [], "now": []}
                    for round_ in range(options.rounds):
                        order = ["ref", "now"] if round_ % 2 == 0 else ["now", "ref"]
                        for side in order:
                            results[side].append(_run_side(sides[side], workload, mode, options))
                    for side in ("ref", "now"):
                        print(f"{workload:<13}{mode:<10}{side:<5}{_cell(results[side], 'thread'):<45}"
                              f"{_cell(results[side], 'wall'):<45}", flush=True)
                    medians = {side: statistics.median(r["thread"][0] for r in results[side]) for side in results}
                    extra = {side: statistics.median(r["thread_ms_per_step"][0] for r in results[side])
                             for side in results}
                    floors = {side: statistics.median(r.get("thread_floor_ms", math.nan) for r in results[side])
                              for side in results}
                    rows.append((workload, mode, medians, extra, floors))
                    if "calls" in results["ref"][0]:
                        calls = {side: results[side][0]["calls"] for side in results}
                        print(f"{'':<23}calls per step, ref -> now: comgra Python {calls['ref']['comgra_python']:.0f} -> "
                              f"{calls['now']['comgra_python']:.0f}, comgra -> C {calls['ref']['comgra_c']:.0f} -> "
                              f"{calls['now']['comgra_c']:.0f}, all Python {calls['ref']['all_python']:.0f} -> "
                              f"{calls['now']['all_python']:.0f}", flush=True)
            if options.app:
                _app(reference, Path(folder), options)
        finally:
            subprocess.run(["git", "-C", str(REPOSITORY), "worktree", "remove", "--force", str(reference)],
                           capture_output=True, text=True)
    if rows:
        print("\nsummary, training thread CPU: ratio to plain training, ref -> now (now/ref of comgra's extra ms)")
    for workload, mode, medians, extra, floors in rows:
        change = extra["now"] / extra["ref"] if extra["ref"] > 0 else float("nan")
        print(f"  {workload:<13}{mode:<10}{medians['ref']:6.3f}x -> {medians['now']:6.3f}x   extra "
              f"{extra['ref']:+8.3f} -> {extra['now']:+8.3f} ms/step ({change:.2f} of before); floor "
              f"{floors['ref']:+8.3f} -> {floors['now']:+8.3f} ms/step")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

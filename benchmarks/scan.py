"""How long ``comgra scan`` takes, whether it grows linearly with the recorded steps, and how fast the
Findings tab opens.

For each scale it writes a synthetic recording shaped like the tutorial's (``synthetic_recording.py``:
2 trials x 240 recorded steps at ``--scale 1``, 50 times as many at ``--scale 50``; cached under
``--out``) and measures, side by side in one run:

* ``comgra scan --path G --json`` as a subprocess (what a user waits for: start-up included);
* a scan in the process, cold (every chunk read) and again with nothing new (the incremental scan
  reads no chunk), and after one new chunk appeared (a live run's flush: only it is read);
* the Findings tab: the service's findings plus the list built from them, cold and warm (the app
  scans in the background when a trial's graph is first shown, so a user opening the tab finds it warm).

    python benchmarks/scan.py                    # scales 1 and 50
    python benchmarks/scan.py --scale 1 --repeats 3
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def recording(out: Path, scale: float) -> Path:
    import synthetic_recording

    root = out / f"scale{scale:g}"
    group = root / synthetic_recording.Options().group
    if not (group / "trials").is_dir():
        synthetic_recording.write_recording(root, synthetic_recording.Options(scale=scale))
    return group


CPU: dict[str, float] = {}  # the CPU seconds of the last timed call: the machine may be shared, so wall time
# alone says little; CPU time (this process and its children) says what the scan itself costs.


def timed(function, repeats: int, name: str = "") -> float:
    times, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), _cpu_seconds()
        function()
        times.append(time.perf_counter() - start)
        cpu.append(_cpu_seconds() - start_cpu)
    if name:
        CPU[name] = statistics.median(cpu)
    return statistics.median(times)


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(group: Path, repeats: int) -> dict[str, float]:
    from comgra.analysis import Scanner
    from comgra.server.findings import filtered, findings_list
    from comgra.service import RecordingService
    from comgra.store import GroupReader
    from comgra.store import format as fmt

    reader = GroupReader(group)
    steps = [len(set(reader.trial(t).steps()["training_step"].to_pylist())) for t in reader.trials()]
    cli = timed(lambda: subprocess.run([sys.executable, "-m", "comgra.cli.app", "scan", "--path", str(group),
                                        "--json"], check=True, capture_output=True), repeats, "cli")
    scanner = Scanner()
    cold = timed(lambda: Scanner().scan(group), repeats, "cold")
    scanner.scan(group)
    unchanged = timed(lambda: scanner.scan(group), repeats)
    trial = reader.trials()[0]
    tensors = fmt.trial_dir(group, trial) / "tensors"
    source = sorted(tensors.glob("*.parquet"))[0]
    extra = tensors / fmt.chunk_name(999_999, 10**9, 10**9)  # steps the index does not list: read, then dropped
    shutil.copy(source, extra)
    try:
        start = time.perf_counter()
        scanner.scan(group)
        one_new_chunk = time.perf_counter() - start
    finally:
        extra.unlink()

    def open_tab(service: RecordingService) -> None:
        findings_list(filtered(service.findings(), None, None, None))

    tab_cold = timed(lambda: open_tab(RecordingService(group)), repeats, "tab_cold")
    service = RecordingService(group)
    open_tab(service)
    tab_warm = timed(lambda: open_tab(service), repeats)
    return {"cpu_cli": CPU["cli"], "cpu_cold": CPU["cold"], "cpu_tab_cold": CPU["tab_cold"], "steps_per_trial": statistics.mean(steps), "steps": sum(steps), "trials": len(steps), "cli": cli, "cold": cold, "unchanged": unchanged,
            "one_new_chunk": one_new_chunk, "tab_cold": tab_cold, "tab_warm": tab_warm,
            "findings": len(scanner.scan(group).findings)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/comgra-bench-scan"))
    parser.add_argument("--scale", type=float, action="append")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--group", type=Path, action="append", default=[],
                        help="an existing group folder to measure as well (e.g. a long synthetic recording)")
    args = parser.parse_args(argv)
    results = {}
    groups = [(f"scale {scale:g}", recording(args.out, scale)) for scale in args.scale or
              ([] if args.group else [1.0, 50.0])] + [(str(g), g) for g in args.group]
    for name, group in groups:
        results[name] = r = measure(group, args.repeats)
        print(f"{name}: {r['trials']} trial(s), {r['steps']} recorded steps in all, {r['findings']} findings\n"
              f"  comgra scan --json (subprocess)     {r['cli']:.2f} s wall, {r['cpu_cli']:.2f} s CPU\n"
              f"  scan in process, cold               {r['cold']:.2f} s wall, {r['cpu_cold']:.2f} s CPU "
              f"({1000 * r['cpu_cold'] / r['steps']:.2f} ms CPU per step)\n"
              f"  scan again, nothing new             {r['unchanged'] * 1000:.1f} ms\n"
              f"  scan again, one new chunk           {r['one_new_chunk']:.2f} s\n"
              f"  Findings tab, cold / warm           {r['tab_cold']:.2f} s ({r['cpu_tab_cold']:.2f} s CPU) / "
              f"{r['tab_warm'] * 1000:.0f} ms", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if len(results) > 1:
        low = min(results, key=lambda n: results[n]["steps"])
        high = max(results, key=lambda n: results[n]["steps"])
        steps = results[high]["steps"] / results[low]["steps"]
        time_ratio = results[high]["cold"] / results[low]["cold"]
        cpu_ratio = results[high]["cpu_cold"] / results[low]["cpu_cold"]
        print(f"{steps:.1f}x the steps: {time_ratio:.1f}x the wall time, {cpu_ratio:.1f}x the CPU time of a cold "
              f"scan (linear: {steps:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

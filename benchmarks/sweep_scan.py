"""``comgra scan`` of a whole sweep: peak RSS and time at 10, 100 and 1,000 trials (issue 30), locally and on Ray,
before (another checkout's sources, e.g. main's) and after (this one's), measured side by side in one run.

The groups come from ``sweep_groups.py`` (a small MLP per trial, 10 recorded steps each), recorded once under
``--out`` and reused. Every scan is cold: the findings a scan saved (``trials/*/analysis``, ``findings/``) are
removed before it. Each scan is a real ``comgra scan GROUP --json`` process; its peak RSS is the kernel's
accounting of that child alone (``wait4``), its CPU the child's user+system time. The machine may be shared:
the load average is printed with each row.

    git archive main src | tar -x -C /tmp/main_src       # the "before" sources
    python benchmarks/sweep_scan.py --trials 10 100 1000 --before-src /tmp/main_src/src --before-max 100 --ray-max 100
    python benchmarks/sweep_scan.py --trials 200 1000 --workers 0 1 --workers-max 200 --ray-max 0   # pool vs one process

The CPU time and peak RSS of a scan include its worker processes (children it waits for). Beside them, "tree": the
peak of the RSS summed over the whole process tree and the CPU of every process in it, sampled every 0.5 s (a Ray
scan's GCS, raylet and workers are not children that ``wait4`` accounts for).

``--engines`` picks the engines of this checkout's scans (default: local, and ray up to ``--ray-max`` trials);
``--group-of N=PATH`` scans an existing group (e.g. one made with ``sweep_groups.py --copy-of``) for size N.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = HERE.parent / "src"
sys.path.insert(0, str(HERE))


def forget_findings(group: Path) -> None:
    for folder in group.glob("trials/*/analysis"):
        shutil.rmtree(folder)
    shutil.rmtree(group / "findings", ignore_errors=True)


def measured_scan(group: Path, sources: Path, engine: str, workers: int = 0) -> dict:
    """One cold ``comgra scan`` in a process of its own: wall seconds, CPU seconds, peak RSS (MiB), findings."""
    forget_findings(group)
    environment = {**os.environ, "PYTHONPATH": str(sources)}
    command = [sys.executable, "-m", "comgra.cli.app", "scan"]
    command += [str(group), "--json", "--engine", engine] if engine != "local" else ["--path", str(group), "--json"]
    command += ["--workers", str(workers)] if workers else []
    load_at_start = round(os.getloadavg()[0], 1)
    start = time.perf_counter()
    process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    tree = _TreeSampler(process.pid)
    output = process.stdout.read() if process.stdout else b""
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    tree.stop()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{command} failed")
    return {"wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_mib": round(usage.ru_maxrss / 1024), "findings": len(json.loads(output)["findings"]),
            "tree_cpu_s": round(tree.cpu_s, 1), "tree_peak_rss_mib": round(tree.peak_rss / 2**20),
            "load_average": f"{load_at_start}-{round(os.getloadavg()[0], 1)}"}


class _TreeSampler:
    """Every 0.5 s, the RSS summed over the scan's process tree (Ray's GCS, raylet and workers too, which are
    not children ``wait4`` accounts for) and each process's CPU time as last seen: the peak of the sum, and the
    CPU of the whole tree (a process's last half second before it ends is missed)."""

    def __init__(self, pid: int) -> None:
        import threading

        import psutil

        self.root, self.peak_rss, self._cpu, self._done = psutil.Process(pid), 0, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def cpu_s(self) -> float:
        return sum(self._cpu.values())

    def _run(self) -> None:
        import psutil

        while not self._done.wait(0.5):
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                continue
            rss = 0
            for process in processes:
                try:
                    with process.oneshot():
                        rss += process.memory_info().rss
                        times = process.cpu_times()
                        self._cpu[process.pid] = times.user + times.system
                except psutil.Error:
                    continue
            self.peak_rss = max(self.peak_rss, rss)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def main() -> None:
    import sweep_groups

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--out", type=Path, default=HERE / "out")
    parser.add_argument("--before-src", type=Path, help="the sources to compare with (e.g. main's src folder)")
    parser.add_argument("--before-max", type=int, default=100, help="the largest group scanned with --before-src")
    parser.add_argument("--ray-max", type=int, default=100, help="the largest group scanned on a local Ray")
    parser.add_argument("--workers", type=int, nargs="+", default=[0],
                        help="local scans of this checkout with each of these --workers (0: comgra's default, one "
                             "process per usable core; 1: in the comgra scan process, as before the pool)")
    parser.add_argument("--engines", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    parser.add_argument("--group-of", action="append", default=[], metavar="N=PATH",
                        help="scan this existing group as the group of N trials (not recorded here)")
    parser.add_argument("--workers-max", type=int, default=1000,
                        help="the largest group scanned with --workers other than the first")
    args = parser.parse_args()
    rows = []
    given = {int(n): Path(path) for n, path in (item.split("=", 1) for item in args.group_of)}
    for count in args.trials:
        group = given[count] if count in given else sweep_groups.record_sweep(args.out / f"sweep{count}", count)
        runs = [("after", SOURCES, "local", w) for i, w in enumerate(args.workers)
                if "local" in args.engines and (i == 0 or count <= args.workers_max)]
        if args.before_src is not None and count <= args.before_max:
            runs.insert(0, ("before", args.before_src, "local", 0))
        if "ray" in args.engines and count <= args.ray_max:
            runs.append(("after", SOURCES, "ray", 0))
        for label, sources, engine, workers in runs:  # interleaved: before and after of one size back to back
            row = {"trials": count, "code": label, "engine": engine, "workers": workers or "default",
                   **measured_scan(group, sources, engine, workers)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep_scan.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{'trials':>7} {'code':>7} {'engine':>7} {'workers':>8} {'wall s':>8} {'CPU s':>7} {'peak MiB':>9} "
          f"{'tree CPU s':>10} {'tree MiB':>9} {'findings':>9} {'load':>9}")
    for row in rows:
        print(f"{row['trials']:>7} {row['code']:>7} {row['engine']:>7} {row['workers']:>8} {row['wall_s']:>8} {row['cpu_s']:>7} "
              f"{row['peak_rss_mib']:>9} {row['tree_cpu_s']:>10} {row['tree_peak_rss_mib']:>9} {row['findings']:>9} "
              f"{row['load_average']:>9}")


if __name__ == "__main__":
    main()

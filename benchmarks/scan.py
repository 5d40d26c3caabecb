"""How long ``comgra scan`` takes, whether it grows linearly with the recorded steps, and how fast the
Findings tab opens, with and without findings saved in the recording.

For each scale it writes a synthetic recording shaped like the tutorial's (``synthetic_recording.py``, through
the store's own writer, merges included, as a run writes it: 2 trials x 240 recorded steps at ``--scale 1``, 50
times as many at ``--scale 50``; written once and cached under ``--out``) and measures, side by side in one run:

* ``comgra scan --path G --json`` as a subprocess (what a user waits for: start-up included), on a recording
  never scanned (the saved findings are removed first) and again with the findings it saved;
* a scan in the process, cold (every chunk read; nothing saved or read from the recording), its time per
  recorded step, again with nothing new (no chunk read), and after one new chunk appeared (a live run's flush);
* the Findings tab in a fresh process that has loaded the app (``comgra --path G``, the tab opened as soon as
  the app is up): its first render (the tab waits at most ``OPEN_WAIT_SECONDS`` for the background scanner,
  then lists what is found and names the trials still being scanned) and the time until every finding is
  listed, never scanned and with the findings saved; and warm.

Findings saved in a recording (``trials/*/analysis/``) are a cache: the benchmark removes them where it needs a
never-scanned recording, also in a ``--group`` it is given.

    python benchmarks/scan.py                    # scales 1 and 50 (50x takes long to write the first time)
    python benchmarks/scan.py --scale 1 --repeats 3
    python benchmarks/scan.py --group G          # an existing recording, e.g. the tutorial's
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def recording(out: Path, scale: float) -> Path:
    """The synthetic recording at ``scale``, written once under ``out`` by the store's writer (as a run
    writes it: chunks every few steps, merged as they accumulate)."""
    import synthetic_recording

    root = out / f"scale{scale:g}"
    group = root / synthetic_recording.Options().group
    if not (group / "trials").is_dir():
        synthetic_recording.write_recording(root, synthetic_recording.Options(scale=scale))
    return group


def forget_saved_findings(group: Path) -> None:
    """Remove the findings a scan saved in the recording: what follows sees a recording never scanned."""
    from comgra.analysis import saved

    for folder in (group / "trials").glob(f"*/{saved.FOLDER}"):
        shutil.rmtree(folder)


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


def measure(group: Path, repeats: int, *, full: bool = True, tabs: bool = True) -> dict[str, Any]:
    """The figures of one recording; ``full=False`` (large recordings) leaves out the repeated subprocess
    scans and the live-run figures, which repeat what the cold scan says."""
    from comgra.analysis import Scanner
    from comgra.store import GroupReader

    reader = GroupReader(group)
    steps = [len(set(reader.trial(t).steps()["training_step"].to_pylist())) for t in reader.trials()]
    result: dict[str, Any] = {"steps": sum(steps), "trials": len(steps)}
    cli = [sys.executable, "-m", "comgra.cli.app", "scan", "--path", str(group), "--json"]
    if full:
        result["cli"] = timed(lambda: forget_saved_findings(group) or subprocess.run(cli, check=True,
                                                                                    capture_output=True),
                              repeats, "cli")
        result["cpu_cli"] = CPU["cli"]
        result["cli_saved"] = timed(lambda: subprocess.run(cli, check=True, capture_output=True), repeats, "cli_saved")
        result["cpu_cli_saved"] = CPU["cli_saved"]
    result["probe"] = _scan_in_fresh_process(group)
    if full:
        import comgra.analysis.detectors  # noqa: F401 - imported once per process (the subprocess figures
        import sklearn.ensemble  # noqa: F401   include it): not counted as the first recording's per-step cost
        result["cold"] = timed(lambda: Scanner().scan(group), repeats, "cold")
        result["cpu_cold"] = CPU["cold"]
        result.update(_live_figures(group, repeats))
    else:  # large: one cold scan, the fresh process's (in-process repeats would only repeat it)
        result["cold"], result["cpu_cold"] = result["probe"]["scan"], result["probe"]["cpu"]
    if tabs:
        result["tab_never_scanned"] = _tab_in_fresh_process(group, repeats if full else 1, saved=False)
        result["tab_saved"] = _tab_in_fresh_process(group, repeats if full else 1, saved=True)
    return result


def _scan_in_fresh_process(group: Path) -> dict[str, float]:
    """A cold scan (nothing saved or read from the recording) in a fresh process: its time and CPU, and
    the process's peak resident memory (imports included)."""
    done = subprocess.run([sys.executable, __file__, "--scan-probe", str(group)], check=True, capture_output=True,
                          text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def scan_probe(group: Path) -> dict[str, float]:
    from comgra.analysis import Scanner

    start, start_cpu = time.perf_counter(), _cpu_seconds()
    found = Scanner().scan(group).findings
    return {"scan": time.perf_counter() - start, "cpu": _cpu_seconds() - start_cpu, "findings": float(len(found)),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _live_figures(group: Path, repeats: int) -> dict[str, float]:
    from comgra.analysis import Scanner
    from comgra.store import GroupReader
    from comgra.store import format as fmt

    scanner = Scanner()
    scanner.scan(group)
    unchanged = timed(lambda: scanner.scan(group), repeats)
    tensors = fmt.trial_dir(group, GroupReader(group).trials()[0]) / "tensors"
    source = sorted(tensors.glob("*.parquet"))[0]
    extra = tensors / fmt.chunk_name(999_999, 10**9, 10**9)  # steps the index does not list: read, then dropped
    shutil.copy(source, extra)
    try:
        start = time.perf_counter()
        scanner.scan(group)
        one_new_chunk = time.perf_counter() - start
    finally:
        extra.unlink()
    return {"unchanged": unchanged, "one_new_chunk": one_new_chunk, "findings": len(scanner.scan(group).findings)}


def _tab_in_fresh_process(group: Path, repeats: int, *, saved: bool) -> dict[str, Any]:
    """The tab's figures, each repeat in a fresh process (``--tab-probe``); ``saved``: after a scan saved its
    findings in the recording, else on a recording never scanned."""
    runs = []
    for _ in range(repeats):
        forget_saved_findings(group)
        if saved:
            subprocess.run([sys.executable, "-m", "comgra.cli.app", "scan", "--path", str(group), "--json"],
                           check=True, capture_output=True)
        done = subprocess.run([sys.executable, __file__, "--tab-probe", str(group)], check=True, capture_output=True,
                              text=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {key: (statistics.median(r[key] for r in runs) if isinstance(runs[0][key], float) else
                  all(r[key] for r in runs)) for key in runs[0]}


def tab_probe(group: Path) -> dict[str, Any]:
    """In this fresh process: load the app (``create_app``, as ``comgra --path`` does), then open the Findings
    tab at once, as its callback does, and wait until every finding is listed."""
    import psutil

    from comgra.server.app import create_app
    from comgra.server.findings import OPEN_WAIT_SECONDS, filtered, findings_list
    from comgra.service import RecordingService

    create_app(group, warm_up=False)  # the modules the app has loaded when its page can be asked for
    service = RecordingService(group)
    try:
        start, start_cpu = time.perf_counter(), _cpu_seconds()
        progress = service.findings_progress(wait_seconds=OPEN_WAIT_SECONDS)
        findings_list(filtered(progress.findings, None, None, None), scanning=progress.pending)
        first = time.perf_counter() - start
        complete = not progress.pending
        found = service.findings()  # waits for the background scan
        findings_list(filtered(found, None, None, None))
        every = time.perf_counter() - start
        cpu = _cpu_seconds() - start_cpu
        warm = timed(lambda: findings_list(filtered(service.findings_progress().findings, None, None, None)), 3)
        time.sleep(0.5)  # the worker lets go of the chunks it read just after its last trial is done
        import gc

        gc.collect()
        rss_after = psutil.Process().memory_info().rss / 2**20
    finally:
        service.close()
    return {"first": first, "first_complete": complete, "every": every, "cpu": cpu, "warm": warm,
            "findings": float(len(found)), "rss_after_mb": rss_after,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def report(name: str, r: dict[str, Any]) -> str:
    lines = [f"{name}: {r['trials']} trial(s), {r['steps']} recorded steps in all"]
    if "cli" in r:
        lines += [f"  comgra scan --json, fresh process, never scanned   {r['cli']:.2f} s wall ({r['cpu_cli']:.2f} s CPU)"
                  "   [target: under 5 s on the tutorial]",
                  f"  comgra scan --json, fresh process, findings saved  {r['cli_saved']:.2f} s wall "
                  f"({r['cpu_cli_saved']:.2f} s CPU)"]
    probe = r["probe"]
    lines.append(f"  scan, fresh process, cold (nothing saved)         {probe['scan']:.2f} s wall ({probe['cpu']:.2f} s CPU), "
                 f"peak RSS {probe['peak_rss_mb']:.0f} MiB   [target: under 1.5 GB at 50x]")
    lines.append(f"  scan in process, cold (nothing saved)             {r['cold']:.2f} s wall ({r['cpu_cold']:.2f} s CPU)")
    lines.append(f"  per recorded step (cold scan)                     {1000 * r['cold'] / r['steps']:.3f} ms wall, "
                 f"{1000 * r['cpu_cold'] / r['steps']:.3f} ms CPU")
    if "unchanged" in r:
        lines += [f"  scan again, nothing new                           {r['unchanged'] * 1000:.1f} ms",
                  f"  scan again, one new chunk                         {r['one_new_chunk']:.2f} s "
                  f"({r['findings']} findings)"]
    for key, label in (("tab_saved", "findings saved "), ("tab_never_scanned", "never scanned  ")):
        if key not in r:
            continue
        tab = r[key]
        lines += [f"  Findings tab, fresh app, {label}: tab shown {tab['first']:.2f} s "
                  f"({'every finding listed' if tab['first_complete'] else 'the rest still being scanned'}); "
                  f"every finding listed {tab['every']:.2f} s ({tab['cpu']:.2f} s CPU); warm {tab['warm'] * 1000:.0f} ms"
                  "   [target: shown in under 1 s]",
                  f"    app process after the scan: RSS {tab['rss_after_mb']:.0f} MiB (peak {tab['peak_rss_mb']:.0f} MiB)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/comgra-bench-scan"))
    parser.add_argument("--scale", type=float, action="append")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--full", action="store_true",
                        help="every figure at every scale (by default 50x gets the cold scan and the tab)")
    parser.add_argument("--group", type=Path, action="append", default=[],
                        help="an existing group folder to measure as well (e.g. the tutorial's)")
    parser.add_argument("--no-tab", action="store_true", help="leave out the Findings tab's figures")
    parser.add_argument("--tab-probe", type=Path, help=argparse.SUPPRESS)  # one fresh-process tab measurement
    parser.add_argument("--scan-probe", type=Path, help=argparse.SUPPRESS)  # one fresh-process cold scan
    args = parser.parse_args(argv)
    if args.tab_probe:
        print(json.dumps(tab_probe(args.tab_probe)))
        return 0
    if args.scan_probe:
        print(json.dumps(scan_probe(args.scan_probe)))
        return 0
    results = {}
    groups = [(f"scale {scale:g}", recording(args.out, scale)) for scale in args.scale or
              ([] if args.group else [1.0, 50.0])] + [(str(g), g) for g in args.group]
    print(f"start: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    for name, group in groups:
        results[name] = measure(group, args.repeats, full=args.full or results_are_small(group), tabs=not args.no_tab)
        print(report(name, results[name]), flush=True)
    print(f"end: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if len(results) > 1:
        low = min(results, key=lambda n: results[n]["steps"])
        print("linearity: a cold scan's time per recorded step, relative to the smallest recording")
        for name, r in sorted(results.items(), key=lambda item: item[1]["steps"]):
            base = results[low]
            print(f"  {name}: {r['steps']} steps ({r['steps'] / base['steps']:.1f}x): "
                  f"{1000 * r['cold'] / r['steps']:.3f} ms wall per step "
                  f"({(r['cold'] / r['steps']) / (base['cold'] / base['steps']):.2f}x), "
                  f"{1000 * r['cpu_cold'] / r['steps']:.3f} ms CPU per step "
                  f"({(r['cpu_cold'] / r['steps']) / (base['cpu_cold'] / base['steps']):.2f}x); "
                  f"peak RSS {r['probe']['peak_rss_mb']:.0f} MiB "
                  f"({r['probe']['peak_rss_mb'] / base['probe']['peak_rss_mb']:.2f}x)")
    return 0


def results_are_small(group: Path) -> bool:
    """Every figure for recordings up to a few thousand steps; the cold scan and the tab above that."""
    from comgra.store import GroupReader

    reader = GroupReader(group)
    return sum(len(reader.trial(t).steps()) for t in reader.trials()) < 20_000


if __name__ == "__main__":
    sys.exit(main())

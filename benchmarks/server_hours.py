"""The server over hours (issue 31 item 13): does its memory level off, with and without the background
findings scan, and do a live trial's findings answer within 2 s?

One training process writes a run (``server_memory.train``: a KPI every step, one step in ``--every`` in full,
flushing every second). Two ``comgra`` servers read it side by side, so that both modes meet the same run at
the same load: one with the default background findings scan, one with ``--no-findings-scan``. Each gets
``--clients`` REST clients (``server_memory.Client``: steps, graph, values, series, KPIs, ... at random) and
one more client that asks ``GET /api/v1/findings?trial=...`` every ``--findings-every`` seconds and times it.

Printed per mode: RSS samples, the Theil-Sen slope of RSS over the second half (MiB per minute, with its 95%
interval; bound 0.5), the findings answers' times (p50, max, how many took over 2 s) and how many were marked
``refreshing`` (the last result while a newer scan runs); and the load average it all ran at.

``--memray DIR`` tracks each server with memray (native stacks, aggregated) until ``--memray-stops`` (seconds, one per
server in order): ``DIR/server-N.bin`` then holds the allocations still alive at that moment, by stack (read them
with ``memray.FileReader(...).get_leaked_allocation_records()``; two servers of one mode stopped at 5 and 10 minutes
show what grew in between). memray's own tables inflate RSS while it tracks: read the slope without it.

    python benchmarks/server_hours.py                    # 15 minutes, 20 clients per server
    python benchmarks/server_hours.py --seconds 120 --clients 5   # a quick look
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FINDINGS_BOUND_S = 2.0


def _server_memory() -> Any:
    spec = importlib.util.spec_from_file_location("server_memory", HERE / "server_memory.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["server_memory"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


memory = _server_memory()


def start_server(group: Path, findings_scan: bool, source: str | None = None,
                 breakdown: Path | None = None, memray_file: Path | None = None,
                 preload: str | None = None) -> tuple[subprocess.Popen, str]:
    """``comgra`` on ``group`` (through server_memory's wrapper: comgra's own CLI, which tells where its memory is
    on SIGUSR2 into ``breakdown``); ``source``: another tree's ``src`` folder to run instead (a baseline);
    ``preload``: a shared library put in ``LD_PRELOAD`` (another allocator for the whole process)."""
    options = [] if findings_scan else ["--no-findings-scan"]
    env = {**os.environ, "COMGRA_BENCH_HERE": str(HERE)}
    if source:
        env["PYTHONPATH"] = source
    if preload:
        env["LD_PRELOAD"] = preload
    if breakdown is not None:
        env["COMGRA_BENCH_BREAKDOWN"] = str(breakdown)
    if memray_file is not None:
        env["COMGRA_BENCH_MEMRAY"] = str(memray_file)
    process = subprocess.Popen([sys.executable, "-c", memory.SERVER, "--path", str(group), "--port", "0", *options],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert process.stdout is not None
    for line in process.stdout:
        match = re.search(r"(http://[^\s?]+)", line)  # reads are open on loopback: no token needed here
        if match:
            url = match.group(1).rstrip("/")
            break
    else:
        raise RuntimeError("the server did not start")
    drain = threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True)  # its log
    drain.start()
    DRAINS[process.pid] = drain
    with urllib.request.urlopen(url + "/api/v1/trials", timeout=120) as response:
        response.read()
    return process, url


DRAINS: dict[int, threading.Thread] = {}  # server pid -> the thread that reads its output


class FindingsClient:
    """Asks for the live trial's findings every ``every`` seconds: (seconds, refreshing, error) per answer."""

    def __init__(self, base: str, every: float):
        self.url = f"{base}/api/v1/findings?trial={memory.TRIAL}"
        self.every = every
        self.answers: list[tuple[float, bool, str | None]] = []

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            began, refreshing, error = time.perf_counter(), False, None
            try:
                with urllib.request.urlopen(self.url, timeout=130) as response:
                    entry = json.loads(response.read())["findings"][0]
                    refreshing = bool(entry.get("refreshing"))
            except (OSError, ValueError, KeyError, IndexError) as failure:
                error = repr(failure)[:200]
            self.answers.append((time.perf_counter() - began, refreshing, error))
            stop.wait(self.every)

    def summary(self) -> str:
        if not self.answers:
            return "findings: no answer"
        seconds = sorted(a[0] for a in self.answers)
        slow = sum(1 for s in seconds if s > FINDINGS_BOUND_S)
        errors = sum(1 for a in self.answers if a[2] is not None)
        marked = sum(1 for a in self.answers if a[1])
        return (f"findings: {len(seconds)} answers, p50 {statistics.median(seconds):.2f} s, max {seconds[-1]:.2f} s, "
                f"{slow} over {FINDINGS_BOUND_S:g} s, {marked} marked refreshing, {errors} errors")


def sample(servers: dict[str, subprocess.Popen], seconds: float, every: float,
           breakdowns: dict[str, Path] | None = None,
           untrack_at: dict[str, float] | None = None) -> dict[str, list[tuple[float, ...]]]:
    """(seconds since the start, RSS MiB, load average, its children's RSS MiB) per server, sampled at the same moments; every 60 s each
    server's breakdown (``server_memory.breakdown_of``: Arrow's pool, glibc's heap, DuckDB, mappings) is printed."""
    import signal

    import psutil

    watched = {mode: psutil.Process(process.pid) for mode, process in servers.items()}
    samples: dict[str, list[tuple[float, ...]]] = {mode: [] for mode in servers}
    began = time.monotonic()
    print("  seconds  " + "  ".join(f"{mode:>22}" for mode in servers) + "  load", flush=True)
    untrack = dict(untrack_at or {})
    while (now := time.monotonic() - began) < seconds:
        for mode in [m for m, at in untrack.items() if now >= at]:  # memray: what this server holds now
            servers[mode].send_signal(signal.SIGHUP)
            del untrack[mode]
        load = os.getloadavg()[0]
        for mode, process in watched.items():
            children = 0.0  # the server's children (the findings scan's process): RSS, MiB
            for child in process.children(recursive=True):
                try:
                    children += child.memory_info().rss / 2**20
                except psutil.Error:  # ended meanwhile
                    pass
            samples[mode].append((now, process.memory_info().rss / 2**20, load, children))
        print(f"  {now:7.0f}  " + "  ".join(f"{samples[m][-1][1]:18.1f} MiB" for m in servers) + f"  {load:4.2f}",
              flush=True)
        if breakdowns and len(samples[next(iter(servers))]) % max(1, round(60 / every)) == 1:
            for mode, process in servers.items():
                print(f"      {mode}: {memory.breakdown_of(breakdowns[mode])}", flush=True)
                process.send_signal(signal.SIGUSR2)
        time.sleep(every)
    return samples


def measure(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(args.out or tempfile.mkdtemp(prefix="comgra-server-hours-"))
    training = memory.start_training(root, argparse.Namespace(seconds=args.seconds, every=args.every,
                                                              steps_per_second=args.steps_per_second))
    modes = {"findings scan": True, "no findings scan": False}
    modes = {mode: scan for mode, scan in modes.items() if mode in args.modes.split(",")}
    sources: dict[str, str | None] = {mode: None for mode in modes}
    preloads: dict[str, str | None] = {mode: None for mode in modes}
    for option, into in ((args.baseline_src, sources), (args.preload, preloads)):
        for other in (option or "").split(","):
            name, _, value = other.rpartition("=")
            if value:
                for mode, scan in [(m, s) for m, s in modes.items() if m in sources and sources[m] is None
                                   and preloads[m] is None]:  # one variant per mode as it was given
                    variant = f"{mode}, {name or 'baseline'}"
                    modes[variant], sources[variant], preloads[variant] = scan, None, None
                    into[variant] = value
    servers, urls, breakdowns = {}, {}, {}
    stops = [float(s) for s in args.memray_stops.split(",")] if args.memray else []
    untrack_at = {}
    for index, (mode, scan) in enumerate(modes.items()):
        breakdowns[mode] = root / f"breakdown-{len(breakdowns)}.json"
        tracked = None
        if args.memray:
            tracked = Path(args.memray) / f"server-{index}.bin"
            untrack_at[mode] = stops[index % len(stops)] if stops else args.seconds - 2 * args.sample_every
            print(f"{mode}: memray into {tracked}, until {untrack_at[mode]:g} s", flush=True)
        servers[mode], urls[mode] = start_server(root / memory.GROUP, scan, sources[mode], breakdowns[mode], tracked,
                                                 preloads[mode])
    stop = threading.Event()
    threads, tallies, finders = [], {}, {}
    skip = tuple(r for r in (args.skip_routes or "").split(",") if r)
    for mode, url in urls.items():
        tallies[mode] = memory.Tally()
        finders[mode] = FindingsClient(url, args.findings_every)
        threads.append(threading.Thread(target=finders[mode].run, args=(stop,), daemon=True))
        threads += [threading.Thread(target=memory.Client(url, seed, tallies[mode], skip).run, args=(stop, args.think),
                                     daemon=True) for seed in range(args.clients)]
    for thread in threads:
        thread.start()
    print(f"{args.clients} REST clients per server for {args.seconds:g} s; servers {urls}", flush=True)
    try:
        samples = sample(servers, args.seconds, args.sample_every, breakdowns, untrack_at)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=140)
        for process in (*servers.values(), training):
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.pid in DRAINS:  # its output read to the end: then the pipe is closed
                DRAINS.pop(process.pid).join(10)
            if process.stdout is not None:
                process.stdout.close()
    results: dict[str, Any] = {}
    print()
    for mode in modes:
        slope, low, high, said = memory.verdict(samples[mode])
        tally = tallies[mode]
        requests, errors = sum(tally.requests.values()), sum(tally.errors.values())
        rss = [s[1] for s in samples[mode]]
        print(f"{mode:>17}: RSS {rss[0]:.0f} -> {rss[len(rss) // 2]:.0f} -> {rss[-1]:.0f} MiB; slope over the second "
              f"half {slope:+.2f} MiB/min (95%: {low:+.2f} to {high:+.2f}; bound {memory.FLAT_MIB_PER_MINUTE}): {said}; "
              f"{requests} requests, {errors} errors" + (f" (last: {tally.last_error})" if errors else ""))
        print(f"{'':>17}  {finders[mode].summary()}")
        tree = [(s[0], s[1] + s[3]) for s in samples[mode]]
        if any(s[3] for s in samples[mode]):  # a findings scan in a child process: the server and its children
            slope_t, low_t, high_t, _ = memory.verdict(tree)
            print(f"{'':>17}  with its children (the scan's process): RSS {tree[0][1]:.0f} -> {tree[len(tree) // 2][1]:.0f}"
                  f" -> {tree[-1][1]:.0f} MiB, most {max(t[1] for t in tree):.0f}; children most "
                  f"{max(s[3] for s in samples[mode]):.0f} MiB; slope {slope_t:+.2f} MiB/min ({low_t:+.2f} to {high_t:+.2f})")
        results[mode] = {"slope": slope, "low": low, "high": high, "requests": requests, "errors": errors,
                         "findings": finders[mode].answers}
    loads = [s[2] for s in samples[next(iter(modes))]]
    print(f"load average (1 min) {min(loads):.2f} - {max(loads):.2f}, median {statistics.median(loads):.2f} "
          f"on {os.cpu_count()} cores")
    return results


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    result.add_argument("--seconds", type=float, default=900.0)
    result.add_argument("--clients", type=int, default=20, help="REST clients per server")
    result.add_argument("--think", type=float, default=0.3, help="a client's mean pause between requests, seconds")
    result.add_argument("--findings-every", type=float, default=5.0)
    result.add_argument("--sample-every", type=float, default=5.0)
    result.add_argument("--every", type=int, default=10, help="one training step in EVERY is recorded in full")
    result.add_argument("--steps-per-second", type=float, default=20.0)
    result.add_argument("--skip-routes", help="routes the REST clients never ask, comma-separated (e.g. series,kpis)")
    result.add_argument("--out", help="the recording's folder (default: a fresh temporary one)")
    result.add_argument("--modes", default="findings scan,no findings scan", help="which servers, comma-separated")
    result.add_argument("--baseline-src", help="other trees' src folders, [NAME=]SRC,...: one more server per mode "
                                               "runs each (e.g. the code before a change, from git archive), side by side")
    result.add_argument("--preload", help="[NAME=]LIB,...: one more server per mode with LIB in LD_PRELOAD (e.g. "
                                           "jemalloc=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2), side by side")
    result.add_argument("--memray", metavar="DIR", help="track each server with memray (native stacks, aggregated) "
                                                        "into DIR/server-N.bin until --memray-stops (then: memray "
                                                        "stats / flamegraph --leaks DIR/server-N.bin)")
    result.add_argument("--memray-stops", default="", help="seconds at which each server (in order) stops tracking, "
                                                           "comma-separated (default: near the end)")
    return result


if __name__ == "__main__":
    measure(parser().parse_args())

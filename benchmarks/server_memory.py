"""The server's memory under many REST clients while a run writes: does it level off?

Three kinds of process, all real:

* a training process (``long_run_controls.make_step("full", ...)``: Linear(8, 16) - ReLU - Linear(16, 1),
  a KPI every step, one step in ``--every`` recorded in full, the writer flushing every second), paced to
  ``--steps-per-second``, so that new chunks keep arriving and the writer keeps merging them;
* ``comgra --path GROUP --no-findings-scan`` (as benchmarks/app_latency.py starts it);
* ``--clients`` threads (default 20), each asking a random REST route after a think time of
  ``--think`` seconds: trials, steps, graph and values at a random recorded step and node, series of a
  node seen, KPIs, layers, modules, notes, run state.

The server's RSS (psutil) is sampled every ``--sample-every`` seconds. Printed: the samples, the
requests and errors, the load average, and the Theil-Sen slope of RSS over the second half of the run
(the first half holds the one-time costs: imports on first use, caches filling up to their bounds) in
MiB per minute with its 95% interval. Verdict: "levels off" when the interval includes 0 or the slope is
below ``FLAT_MIB_PER_MINUTE``.

Every 30 s the server (through a signal the wrapper below handles) also tells where its memory is:
Arrow's pool, glibc's heap in use and free but kept (mallinfo2), DuckDB's own accounting, Python's
allocated blocks, the TrialReaders and the small tables they keep. ``--malloc-arena-max N`` starts the
server with ``MALLOC_ARENA_MAX=N`` (``comgra`` limits glibc's arenas to 2 itself; 16 is glibc's default on
2 cores, the server before that limit).

``--leak-kib-per-request`` plants a leak in the server (a wrapper keeps that many KiB per REST answer),
to see the verdict fail. ``--tracemalloc`` starts the server with ``PYTHONTRACEMALLOC`` and prints,
at the end, what grew between the middle and the end of the run (the server's side, through
``COMGRA_BENCH_TRACEMALLOC_DIR``: the wrapper dumps a snapshot on SIGUSR1).

    python benchmarks/server_memory.py                      # 10 minutes, 20 clients
    python benchmarks/server_memory.py --seconds 120        # a quick look
    python benchmarks/server_memory.py --seconds 180 --leak-kib-per-request 4   # the verdict must say NOT
    python benchmarks/server_memory.py --malloc-arena-max 16   # glibc's default arenas on 2 cores, as before
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FLAT_MIB_PER_MINUTE = 0.5  # bound on the slope of RSS over the second half (a leak of 1 KiB a request at
#                            this load, about 50 requests a second, would show as about 3 MiB a minute)
GROUP, TRIAL = "long", "trial"

# The server, started through this wrapper: comgra's own CLI, with the planted leak and the snapshot
# signal only where the benchmark asks for them.
SERVER = r"""
import os, signal, sys, tracemalloc
leak_kib = int(os.environ.get("COMGRA_BENCH_LEAK_KIB", "0"))
if leak_kib:
    import comgra.server.api as api
    kept, answer = [], api.answer
    def leaking_answer(*args, **kwargs):
        kept.append(bytearray(os.urandom(leak_kib * 1024)))
        return answer(*args, **kwargs)
    api.answer = leaking_answer
folder = os.environ.get("COMGRA_BENCH_TRACEMALLOC_DIR")
if folder:
    count = [0]
    def dump(*_):
        count[0] += 1
        tracemalloc.take_snapshot().dump(os.path.join(folder, f"snapshot-{count[0]}.pickle"))
    signal.signal(signal.SIGUSR1, dump)
breakdown = os.environ.get("COMGRA_BENCH_BREAKDOWN")
if breakdown:  # on SIGUSR2: where the memory is, as JSON (read by the benchmark; a signal runs between requests)
    import gc, json, threading  # pyarrow only when asked: comgra chooses Arrow's pool before pyarrow loads
    sys.path.insert(0, os.environ["COMGRA_BENCH_HERE"])
    from process_memory import native_heap_mib, pymalloc_mib
    def tell(*_):
        try:
            told()
        except Exception as error:  # a signal handler's exception would end the server
            print(f"breakdown failed: {error!r}", file=sys.stderr, flush=True)
    def told():
        import pyarrow as pa
        from comgra.store.reader import TrialReader
        readers = [o for o in gc.get_objects() if isinstance(o, TrialReader)]
        data = {"arrow": pa.total_allocated_bytes() / 2**20, "pool": pa.default_memory_pool().backend_name, **native_heap_mib(), **pymalloc_mib(), "blocks": sys.getallocatedblocks(),
                "threads": threading.active_count(), "readers": len(readers),
                "kept_tables": sum(len(r._small._cache) for r in readers),
                "graphs": sum(len(r._graphs) for r in readers),
                "series_memo": sum(getattr(getattr(r, "_series_reader", None), "kept_series_bytes", 0) for r in readers) / 2**20,
                "footers": sum(getattr(getattr(r, "_series_reader", None), "kept_footer_bytes", 0) for r in readers) / 2**20,
                "duckdb": sum(c.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()[0]
                              or 0 for c in map(connection_of, readers) if c is not None) / 2**20,
                "smaps": smaps_mib()}
        trimmers = [o for o in gc.get_objects() if type(o).__name__ == "HeapTrimmer"]  # comgra/server/heap.py
        if trimmers:
            data["trims"], data["trim_cpu_s"] = trimmers[0].trims, trimmers[0].cpu_seconds
        counts = {}
        for o in gc.get_objects():
            counts[type(o).__name__] = counts.get(type(o).__name__, 0) + 1
        data["gc_objects"] = sum(counts.values())
        data["types"] = dict(sorted(counts.items(), key=lambda kv: -kv[1])[:40])
        with open(breakdown + ".history", "a") as out:  # every breakdown, one JSON line each: what grew by kind
            out.write(json.dumps(data) + "\n")
        with open(breakdown + ".tmp", "w") as out:
            json.dump(data, out)
        os.replace(breakdown + ".tmp", breakdown)
    def connection_of(reader):  # the reader's DuckDB connection, in this tree and in older ones
        duck = getattr(reader, "_duck", None)
        return duck.connection if duck is not None else getattr(reader, "_connection", None)
    def smaps_mib():  # resident anonymous memory by kind of mapping: glibc's [heap], other anonymous maps, files
        kinds, kind, maps = {"heap": 0, "anon": 0, "file": 0}, "file", []
        with open("/proc/self/smaps") as lines:
            for line in lines:
                first = line.split(None, 6)
                if "-" in first[0] and len(first) >= 5 and ":" not in first[0]:
                    name = first[5].strip() if len(first) > 5 else ""
                    kind = "heap" if name == "[heap]" else "anon" if not name or name.startswith("[anon") else "file"
                    maps.append([first[0], first[1], kind, 0, 0])
                elif first[0] == "Size:":
                    maps[-1][3] = int(first[1])
                elif first[0] == "Rss:":
                    kinds[kind] += int(first[1])
                    maps[-1][4] = int(first[1])
        with open(breakdown + ".maps", "w") as out:  # each anonymous mapping: address, perms, size and RSS in KiB
            json.dump([m for m in maps if m[2] != "file"], out)
        for address, _, kind, size, rss in maps:  # anonymous memory outside glibc's main heap, by its likely owner
            if kind == "anon":
                start = int(address.split("-")[0], 16)
                owner = ("glibc arenas" if start % (64 << 20) == 0 else "stacks" if size == 8192
                         else "python arenas" if size == 1024 else "other anon")
                kinds[owner] = kinds.get(owner, 0) + rss
        return {k: v / 1024 for k, v in kinds.items()}
    signal.signal(signal.SIGUSR2, tell)
tracked = os.environ.get("COMGRA_BENCH_MEMRAY")
if tracked:  # memray (native stacks, aggregated) from here until SIGHUP: what is still held then, by stack
    import memray
    tracker = memray.Tracker(tracked, native_traces=True, file_format=memray.FileFormat.AGGREGATED_ALLOCATIONS)
    tracker.__enter__()
    def untrack(*_):
        tracker.__exit__(None, None, None)
        print(f"memray: tracking stopped, {tracked} written", file=sys.stderr, flush=True)
    signal.signal(signal.SIGHUP, untrack)
from comgra.cli.app import run
sys.argv = ["comgra", *sys.argv[1:]]
run()
"""


# -- the training process --------------------------------------------------------------------------------
def train(root: Path, seconds: float, every: int, steps_per_second: float) -> None:
    """The run: paced steps until ``seconds`` have passed, then ``finalize``."""
    sys.path.insert(0, str(HERE))
    from long_run_controls import make_step

    loop = make_step("full", root, every, {"flush_seconds": 1.0, "max_flush_seconds": 2.0})
    began, step = time.monotonic(), 0
    while time.monotonic() - began < seconds:
        loop.step(step)
        step += 1
        ahead = began + step / steps_per_second - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    loop.finish()
    print(f"trained {step} steps", flush=True)


def start_training(root: Path, args: argparse.Namespace) -> subprocess.Popen:
    command = [sys.executable, __file__, "--train", str(root), "--seconds", str(args.seconds + 120),
               "--every", str(args.every), "--steps-per-second", str(args.steps_per_second)]
    process = subprocess.Popen(command, env=os.environ.copy())
    steps = root / GROUP  # format 3: the tables lie beside trials/, in GROUP/<table>/trial=<id>/
    deadline = time.monotonic() + 120
    while not any(steps.rglob("*.parquet")):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the training process wrote nothing (exit code {process.poll()})")
        time.sleep(0.5)
    time.sleep(3)  # a few flushes: steps, graphs and tensors chunks
    return process


def start_server(group: Path, leak_kib: int, snapshots: Path | None, arena_max: int = 0) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "COMGRA_BENCH_LEAK_KIB": str(leak_kib), "COMGRA_BENCH_HERE": str(HERE),
           "COMGRA_BENCH_BREAKDOWN": str(group.parent / "breakdown.json")}
    if arena_max:
        env["MALLOC_ARENA_MAX"] = str(arena_max)
    if snapshots is not None:
        env.update(PYTHONTRACEMALLOC="10", COMGRA_BENCH_TRACEMALLOC_DIR=str(snapshots))
    process = subprocess.Popen([sys.executable, "-c", SERVER, "--path", str(group), "--port", "0", "--no-findings-scan"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert process.stdout is not None
    for line in process.stdout:
        match = re.search(r"(http://[^\s?]+)", line)  # the address without ?token=: reads are open on loopback
        if match:
            url = match.group(1).rstrip("/")
            break
    else:
        raise RuntimeError("the server did not start")
    threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()  # drain its log
    urllib.request.urlopen(url + "/api/v1/trials", timeout=60).read()
    return process, url


# -- the clients -------------------------------------------------------------------------------------------
class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.seconds: list[float] = []
        self.last_error = ""

    def add(self, route: str, seconds: float, error: str | None) -> None:
        with self.lock:
            self.requests[route] = self.requests.get(route, 0) + 1
            self.seconds.append(seconds)
            if error is not None:
                self.errors[route] = self.errors.get(route, 0) + 1
                self.last_error = f"{route}: {error}"


ROUTE_WEIGHTS = {"graph": 3, "values": 8, "series": 3, "kpis": 2, "layers": 1, "modules": 1, "notes": 1, "trials": 1,
                 "run": 1}  # how often a client asks each route, besides the steps


class Client:
    """One REST client: knows the recorded steps, the nodes it has seen and their roles."""

    def __init__(self, base: str, seed: int, tally: Tally, skip: tuple[str, ...] = ()):
        self.api = f"{base}/api/v1"
        self.trial = f"{self.api}/trials/{TRIAL}"
        self.random = random.Random(seed)
        self.tally = tally
        self.steps: list[int] = []
        self.nodes: dict[int, list[str]] = {}  # step -> node ids of its graph
        self.roles: dict[str, tuple[str, str]] = {}  # node id -> (node, role) for series
        # The routes it asks, with their weights; ``skip``: those it never asks (a route's cost, by its absence)
        self.routes = {route: weight for route, weight in ROUTE_WEIGHTS.items() if route not in skip}

    def get(self, route: str, url: str) -> Any:
        began, error, data = time.perf_counter(), None, None
        try:
            with urllib.request.urlopen(url, timeout=120) as response:
                data = json.loads(response.read())
        except urllib.error.HTTPError as failure:
            error = f"{failure.code} {failure.read()[:200]!r}"
        except (OSError, ValueError) as failure:
            error = repr(failure)[:200]
        self.tally.add(route, time.perf_counter() - began, error)
        return data

    def one_request(self) -> None:
        if not self.steps or self.random.random() < 0.1:
            data = self.get("steps", f"{self.trial}/steps")
            if data:
                self.steps = sorted({row["training_step"] for row in data["steps"]})
            return
        step = self.random.choice(self.steps)
        route = self.random.choices(list(self.routes), weights=list(self.routes.values()))[0]
        if route == "graph" or (route == "values" and step not in self.nodes):
            data = self.get("graph", f"{self.trial}/graph?step={step}")
            if data:
                self.nodes[step] = [node["id"] for node in data["graph"]["nodes"]]
        elif route == "values":
            node = self.random.choice(self.nodes[step])
            data = self.get("values", f"{self.trial}/values?" + urllib.parse.urlencode({"step": step, "node": node}))
            if data:
                selection = data["selection"]
                self.roles[node] = (selection["node"], selection["role"])
        elif route == "series" and self.roles:
            node, role = self.roles[self.random.choice(sorted(self.roles))]
            self.get("series", f"{self.trial}/series?" + urllib.parse.urlencode({"node": node, "role": role}))
        elif route == "trials":
            self.get("trials", f"{self.api}/trials")
        elif route in ("kpis", "layers", "modules", "notes", "run"):
            self.get(route, f"{self.trial}/{route}")

    def run(self, stop: threading.Event, think: float) -> None:
        while not stop.is_set():
            self.one_request()
            stop.wait(self.random.uniform(0.5, 1.5) * think)


# -- memory ------------------------------------------------------------------------------------------------
def sample_memory(process: subprocess.Popen, seconds: float, every: float, tally: Tally, breakdown: Path) -> list[tuple[float, ...]]:
    """(seconds since the start, RSS in MiB, requests done, load average, the server's threads, its open
    files) every ``every`` seconds."""
    import psutil

    server = psutil.Process(process.pid)
    samples, began, told = [], time.monotonic(), -1e9
    print("  seconds  RSS MiB  requests  load  threads  files", flush=True)
    while (now := time.monotonic() - began) < seconds:
        with tally.lock:
            done = sum(tally.requests.values())
        samples.append((now, server.memory_info().rss / 2**20, done, os.getloadavg()[0], server.num_threads(),
                        server.num_fds()))
        line = "  {:7.0f}  {:7.1f}  {:8.0f}  {:4.2f}  {:7.0f}  {:5.0f}".format(*samples[-1])
        if now - told >= 30:  # the server's own breakdown, asked for the previous time
            told = now
            line += "  " + breakdown_of(breakdown)
            process.send_signal(signal.SIGUSR2)
        print(line, flush=True)
        time.sleep(every)
    return samples


def breakdown_of(path: Path) -> str:
    """The server's last breakdown: Arrow's pool, glibc's heap in use / free but kept, Python's blocks, the
    TrialReaders and the small tables they keep."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    return (f"arrow ({data.get('pool')}) {data['arrow']:.1f}  malloc used {data.get('malloc_used', 0):.1f} free {data.get('malloc_free', 0):.1f}"
            f"  duckdb {data.get('duckdb', 0):.1f}  python blocks {data['blocks']:,}  readers {data['readers']}"
            f"  kept tables {data['kept_tables']}  graphs {data.get('graphs')}  threads {data.get('threads')}"
            f"  series memo {data.get('series_memo', 0):.1f} footers {data.get('footers', 0):.1f}"
            f"  gc objects {data.get('gc_objects', 0):,}"
            + (f"  py arenas {data['py_arenas']:.0f} (blocks {data['py_in_blocks']:.1f} MiB)" if "py_arenas" in data else "")
            + (f"  trims {data['trims']} ({data['trim_cpu_s'] * 1000:.0f} ms CPU)" if "trims" in data else "")
            + "".join(f"  {k} {v:.1f}" for k, v in data.get("smaps", {}).items()))


def verdict(samples: list[tuple[float, ...]]) -> tuple[float, float, float, str]:
    """Theil-Sen slope of RSS (MiB per minute) over the second half, its 95% interval, and the verdict."""
    from scipy.stats import theilslopes

    half = [s for s in samples if s[0] >= samples[-1][0] / 2]
    slope, _, low, high = theilslopes([s[1] for s in half], [s[0] / 60 for s in half], alpha=0.95)
    flat = low <= 0 <= high or slope < FLAT_MIB_PER_MINUTE
    return slope, low, high, "levels off" if flat else "NOT level: RSS keeps growing"


def tracemalloc_growth(folder: Path, count: int = 15) -> list[str]:
    import tracemalloc

    names = sorted(folder.glob("snapshot-*.pickle"), key=lambda p: int(p.stem.split("-")[1]))
    if len(names) < 2:
        return ["(fewer than two snapshots)"]
    before, after = (tracemalloc.Snapshot.load(str(n)) for n in (names[0], names[-1]))
    lines = []
    for difference in after.compare_to(before, "traceback")[:count]:
        frames = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in difference.traceback[:6])
        lines.append(f"{difference.size_diff / 1024:+9.1f} KiB {difference.count_diff:+7d} blocks  {frames}")
    return lines


def measure(args: argparse.Namespace) -> None:
    root = Path(args.out or tempfile.mkdtemp(prefix="comgra-server-memory-"))
    snapshots = root / "snapshots" if args.tracemalloc else None
    if snapshots is not None:
        snapshots.mkdir(parents=True, exist_ok=True)
    training = start_training(root, args)
    server, url = start_server(root / GROUP, args.leak_kib_per_request, snapshots, args.malloc_arena_max)
    print(f"server {url}, pid {server.pid}; training pid {training.pid}; {args.clients} clients for {args.seconds:g} s",
          flush=True)
    tally, stop = Tally(), threading.Event()
    clients = [threading.Thread(target=Client(url, seed, tally).run, args=(stop, args.think), daemon=True)
               for seed in range(args.clients)]
    for thread in clients:
        thread.start()
    if snapshots is not None:
        threading.Timer(args.seconds / 2, server.send_signal, (signal.SIGUSR1,)).start()
        threading.Timer(args.seconds - 2 * args.sample_every, server.send_signal, (signal.SIGUSR1,)).start()
    try:
        samples = sample_memory(server, args.seconds, args.sample_every, tally, root / "breakdown.json")
    finally:
        stop.set()
        for thread in clients:
            thread.join(timeout=130)
        for process in (server, training):  # SIGTERM: a shell's background job ignores SIGINT
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    report(samples, tally, root, snapshots)


def report(samples: list[tuple[float, ...]], tally: Tally, root: Path, snapshots: Path | None) -> None:
    total, errors = sum(tally.requests.values()), sum(tally.errors.values())
    duration = samples[-1][0] or 1
    print(f"\nrequests {total} ({total / duration:.1f} a second), errors {errors}"
          + (f" (last: {tally.last_error})" if errors else ""))
    print("by route: " + ", ".join(f"{route} {count}" for route, count in sorted(tally.requests.items())))
    if tally.seconds:
        ordered = sorted(tally.seconds)
        print(f"answer time p50 {statistics.median(ordered) * 1000:.0f} ms, "
              f"p95 {ordered[int(0.95 * (len(ordered) - 1))] * 1000:.0f} ms")
    loads = [s[3] for s in samples]
    print(f"load average (1 min) {min(loads):.2f} - {max(loads):.2f}, median {statistics.median(loads):.2f}")
    chunks = sum(1 for _ in (root / GROUP).rglob("*.parquet"))
    print(f"chunk files at the end: {chunks}")
    print(f"RSS at start {samples[0][1]:.1f} MiB, at half time {samples[len(samples) // 2][1]:.1f}, "
          f"at the end {samples[-1][1]:.1f}, most {max(s[1] for s in samples):.1f}")
    slope, low, high, said = verdict(samples)
    print(f"RSS slope over the second half (Theil-Sen): {slope:+.3f} MiB per minute "
          f"(95%: {low:+.3f} to {high:+.3f}; bound {FLAT_MIB_PER_MINUTE}): {said}")
    if snapshots is not None:
        print("\nwhat grew in the server's Python heap, from half time to the end (tracemalloc):")
        print("\n".join(tracemalloc_growth(snapshots)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--think", type=float, default=0.3, help="a client's mean pause between requests, seconds")
    parser.add_argument("--sample-every", type=float, default=5.0)
    parser.add_argument("--every", type=int, default=10, help="one training step in EVERY is recorded in full")
    parser.add_argument("--steps-per-second", type=float, default=20.0)
    parser.add_argument("--leak-kib-per-request", type=int, default=0)
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--malloc-arena-max", type=int, default=0,
                        help="the server's MALLOC_ARENA_MAX (glibc); 0: glibc's default, 8 per core")
    parser.add_argument("--out", help="the recording's folder (default: a fresh temporary one)")
    parser.add_argument("--train", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train:
        train(Path(args.train), args.seconds, args.every, args.steps_per_second)
    else:
        measure(args)


if __name__ == "__main__":
    main()

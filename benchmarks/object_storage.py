"""Recordings in object storage, measured against moto's S3 server on this machine (127.0.0.1).

Each part prints its figures side by side with the local baseline measured in the same run (interleaved where
both are timed), and the load average it ran at:

* ``training``: the training's own time (the loop, not finalize) of an MLP recorded every 10th step, with the
  recorder's root a local folder and an ``s3://`` URL, alternating run by run; finalize's wait for the upload
  is reported apart;
* ``app``: ``comgra --path`` on a synthetic recording (benchmarks/synthetic_recording.py, ``--scale``; with
  ``--compact`` one tensors object per trial) on local disk and in S3: time until the first page is served and its
  view answered (S3 cold: an empty mirror; warm: the mirror of an earlier start), then one click on each node (the
  values route), alternating local / S3; the bytes fetched from S3 counted by a proxy (tests/objstore/s3_faults.py);
* ``sweep``: a 1,000-trial sweep of ten-step trials (one trial recorded, copied under 1,000 ids), uploaded with
  comgra's uploader (upload throughput: objects/s and MiB/s), then the tensors table of every trial read from
  the bucket by pyarrow.dataset, DuckDB (over that Arrow dataset), polars, Dask and Ray Data, and by comgra's
  reader (a cold mirror of the group).

    python benchmarks/object_storage.py                       # all parts
    python benchmarks/object_storage.py --part training --repeats 7
    python benchmarks/object_storage.py --part sweep --trials 1000
    python benchmarks/object_storage.py --part app --scale 4 --compact --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def start_moto(cpus: set[int] | None = None) -> tuple[subprocess.Popen, str]:
    """moto's S3 server in a process of its own, on ``cpus`` where given (``--pin``)."""
    def lower() -> None:
        os.nice(10)
        if cpus:
            os.sched_setaffinity(0, cpus)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # At a lowered priority, as a remote store costs the training machine nothing: what is measured is comgra's cost.
    server = subprocess.Popen([sys.executable, "-c", "from moto.server import main; main()", "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              preexec_fn=lower)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    endpoint = f"http://127.0.0.1:{port}"
    SERVER["pid"] = server.pid
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1")
    return server, endpoint


SERVER = {"pid": 0}  # moto's process: its CPU is the store's, not the training machine's (reported apart)


def server_cpu() -> float:
    """CPU seconds moto's process has used so far (0 where /proc is not there)."""
    try:
        with open(f"/proc/{SERVER['pid']}/stat") as stream:
            fields = stream.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def bucket(name: str) -> str:
    import boto3

    boto3.client("s3").create_bucket(Bucket=name)
    return f"s3://{name}"


def median(samples: list[float]) -> float:
    return statistics.median(samples)


# -- training ------------------------------------------------------------------------------------------------
def train_once(root: str | Path, trial: str, steps: int) -> tuple[float, ...]:
    """Seconds of one recorded run: (the training loop's wall clock, finalize's wall clock, the training thread's
    CPU time in the loop, the whole process's CPU time in the loop: the writer's and the uploader's threads too),
    the uploader thread's passes (and backlog checks) per second of the loop and its CPU seconds in them per
    second of the loop (0 for a local root), and the S3 server's CPU seconds per second of the loop (moto's
    process: what a real bucket, elsewhere, would spend)."""
    import torch

    from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
    from comgra.recorder import ComgraRecorder

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[layer for _ in range(4) for layer in (torch.nn.Linear(256, 256), torch.nn.ReLU())],
                                torch.nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(64, 256)
    recorder = ComgraRecorder(root, "bench", trial, DecisionMakerForRecordingsFrequencyPerType(10))
    recorder.track_module("main", model)
    started = time.perf_counter()
    thread_cpu, process_cpu = time.thread_time(), time.process_time()
    passes, pass_cpu = UPLOADER_WORK["calls"], UPLOADER_WORK["cpu"]
    store_cpu = server_cpu()
    for step in range(steps):
        recorder.start_batch(step, 64)
        recorder.start_iteration()
        recorder.register_tensor("x", data, is_input=True)
        out = model(data)
        loss = out.pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
    trained = time.perf_counter() - started
    thread_cpu, process_cpu = time.thread_time() - thread_cpu, time.process_time() - process_cpu
    passes, pass_cpu = UPLOADER_WORK["calls"] - passes, UPLOADER_WORK["cpu"] - pass_cpu
    store_cpu = server_cpu() - store_cpu
    started = time.perf_counter()
    recorder.finalize()
    return (trained, time.perf_counter() - started, thread_cpu, process_cpu, passes / trained, pass_cpu / trained,
            store_cpu / trained)


# What the uploader's own thread does while the training runs (its passes and backlog checks): counted by wrapping
# the Uploader's methods, so that the same count works on any version of comgra (run against another checkout with
# PYTHONPATH=<its src>).
UPLOADER_WORK = {"calls": 0, "cpu": 0.0}


def count_uploader_work() -> None:
    import threading

    from comgra.store import uploader

    for name in ("run_pass", "measure_backlog"):
        original = getattr(uploader.Uploader, name)

        def counted(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if threading.current_thread().name != "comgra-uploader":
                return _original(self, *args, **kwargs)
            started = time.thread_time()
            try:
                return _original(self, *args, **kwargs)
            finally:
                UPLOADER_WORK["calls"] += 1
                UPLOADER_WORK["cpu"] += time.thread_time() - started

        setattr(uploader.Uploader, name, counted)


def part_training(args: argparse.Namespace, out: Path) -> None:
    import torch

    torch.set_num_threads(1)
    count_uploader_work()
    url = bucket("bench-training") + "/runs"
    local = out / "training-local"
    train_once(local, "warmup", 20)
    train_once(url, "warmup", 20)
    figures: dict[str, dict[str, list[float]]] = {kind: {"loop": [], "finalize": [], "thread": [], "process": [],
                                                          "passes": [], "pass_cpu": [], "store_cpu": []}
                                                   for kind in ("local", "s3")}
    for repeat in range(args.repeats):
        for kind, root in (("local", local), ("s3", url)) if repeat % 2 == 0 else (("s3", url), ("local", local)):
            for name, value in zip(("loop", "finalize", "thread", "process", "passes", "pass_cpu", "store_cpu"),
                                   train_once(root, f"run{repeat}", args.steps)):
                figures[kind][name].append(value)
    print(f"\n## training cost ({args.steps} steps of a 4x256 MLP, every 10th step recorded, {args.repeats} runs "
          f"each, alternating; {load()})")
    print("| root | training loop, wall clock, median (s) | all runs (s) | training thread's CPU, median (s) | "
          "process CPU in the loop, median (s) | finalize, median (s) |")
    print("|---|---|---|---|---|---|")
    for kind in ("local", "s3"):
        f = figures[kind]
        print(f"| {kind} | {median(f['loop']):.3f} | {', '.join(f'{t:.2f}' for t in f['loop'])} | "
              f"{median(f['thread']):.3f} | {median(f['process']):.3f} | {median(f['finalize']):.3f} |")
    print(f"the uploader thread while training: median {median(figures['s3']['passes']):.2f} passes (or backlog "
          f"checks) per second, {1000 * median(figures['s3']['pass_cpu']):.1f} ms of its CPU per second of training; "
          f"moto's process (the store, not the training machine's cost): "
          f"{1000 * median(figures['s3']['store_cpu']):.1f} ms of CPU per second of training")
    for name, label in (("loop", "wall clock"), ("thread", "training thread's CPU"), ("process", "process CPU")):
        pairs = [s / loc for s, loc in zip(figures["s3"][name], figures["local"][name])]
        print(f"S3 / local, {label}: median {median(figures['s3'][name]) / median(figures['local'][name]):.3f}x, "
              f"least disturbed run of each {min(figures['s3'][name]) / min(figures['local'][name]):.3f}x "
              f"(per alternating pair: {', '.join(f'{r:.3f}' for r in pairs)})")


# -- the app -------------------------------------------------------------------------------------------------
def part_app(args: argparse.Namespace, out: Path) -> None:
    import app_latency
    import random

    sys.path.insert(0, str(HERE.parent / "tests" / "objstore"))
    from s3_faults import Faults, FaultyProxy

    from comgra.store.filesystems import open_location
    from comgra.store.uploader import Uploader

    group = app_latency.recording_for(args.scale, out / "app")
    if args.compact:  # one object per table and rank of each trial: the tensors table of a trial is one large object
        subprocess.run([sys.executable, "-m", "comgra.cli.app", "compact", str(group)], check=True,
                       stdout=subprocess.DEVNULL)
    url = bucket(f"bench-app-{os.getpid()}") + "/runs/synthetic"
    shutil.rmtree(out / "app-journal", ignore_errors=True)  # a fresh server: nothing of an earlier run is up
    uploader = Uploader(group, open_location(url), journal_root=out / "app-journal")
    started = time.perf_counter()
    result = uploader.finish(3600)
    print(f"# uploaded the app's recording: {uploader.total.uploaded} objects, {uploader.total.bytes / 2**20:.1f} MiB "
          f"in {time.perf_counter() - started:.1f} s (pending {result.pending})")
    tensors = sorted(size for key, (size, _) in open_location(url).list_files().items()
                     if "tensors" in key.split("/")[:-1])
    print(f"# tensors objects: {len(tensors)}, {sum(tensors) / 2**20:.1f} MiB, the largest {tensors[-1] / 2**20:.1f} MiB")
    # Between the app and the S3 server: a proxy without faults, which counts the bytes each GET is answered with.
    proxy = FaultyProxy(os.environ["AWS_ENDPOINT_URL"], Faults())
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    cache = out / "app-cache"
    kinds = ["local", "s3 cold", "s3 warm"] + (["s3 cold, baseline"] if args.baseline_src else [])
    first: dict[str, list[float]] = {kind: [] for kind in kinds}
    clicks: dict[str, list[float]] = {kind: [] for kind in kinds}
    fetched: dict[str, list[float]] = {kind: [] for kind in kinds[1:]}  # MiB: the first page, then per click
    click_bytes: dict[str, list[float]] = {kind: [] for kind in kinds[1:]}
    rng = random.Random(0)

    def serve(kind: str, path: str) -> None:
        baseline = kind.endswith("baseline")  # another tree's comgra (--baseline-src), its own cache
        if kind.startswith("s3 cold"):
            shutil.rmtree(cache.with_name("app-cache-baseline") if baseline else cache, ignore_errors=True)
        os.environ["XDG_CACHE_HOME"] = str(cache.with_name("app-cache-baseline") if baseline else cache)
        os.environ["AWS_ENDPOINT_URL"] = proxy.url
        before = proxy.faults.sent["GET"]
        started = time.perf_counter()
        process, address, _ = app_latency.start_server(path, args.baseline_src if baseline else None)  # type: ignore
        try:
            client = app_latency.DashClient(*app_latency.urllib_transport(address.rstrip("/")))
            client.trigger(app_latency.VIEW_OUTPUT)
            first[kind].append(time.perf_counter() - started)
            if kind in fetched:
                fetched[kind].append((proxy.faults.sent["GET"] - before) / 2**20)
            nodes = [n["id"] for n in client.graph()["nodes"]]
            for node in rng.sample(nodes, min(args.clicks, len(nodes))):  # each node once: its first click
                before = proxy.faults.sent["GET"]
                clicks[kind].append(app_latency.timed(lambda node=node: client.click_values(node)))
                if kind in click_bytes:
                    click_bytes[kind].append((proxy.faults.sent["GET"] - before) / 2**20)
        except Exception:
            process.terminate()
            print(f"# the server of {kind} failed:\n" + process.stdout.read()[-3000:], file=sys.stderr)
            raise
        finally:
            os.environ["AWS_ENDPOINT_URL"] = endpoint
            process.terminate()
            process.wait(10)

    failures: list[str] = []
    cpu = time.process_time()
    try:
        for repeat in range(args.repeats):
            order = [("local", str(group))] + [(kind, url) for kind in kinds[1:]]
            for kind, path in order if repeat % 2 == 0 else order[1:] + order[:1]:
                try:
                    serve(kind, path)
                except Exception as error:  # noqa: BLE001 - reported below; the start is measured again
                    failures.append(f"{kind}: {type(error).__name__}: {error}")
                    serve(kind, path)
    finally:
        proxy.close()
    if failures:
        print(f"# {len(failures)} start(s) failed and were repeated: {failures}")
    print(f"\n## the app on S3 against local disk (synthetic recording, scale {args.scale:g}"
          f"{', compacted' if args.compact else ''}; {args.repeats} starts each, alternating; driver-timed over HTTP; "
          f"{load()}; the driver's CPU {time.process_time() - cpu:.1f} s)")
    print("| recording | start until the first page's view is answered, median (s) | all (s) | MiB fetched from S3 |")
    print("|---|---|---|---|")
    for kind, samples in first.items():
        got = fetched.get(kind)
        print(f"| {kind} | {median(samples):.2f} | {', '.join(f'{s:.2f}' for s in samples)} | "
              f"{median(got) if got else 0:.2f} |")
    print("| recording | node click (values route; each node's first click of a start), median (ms) | p95 (ms) | "
          "MiB fetched per click, median / max |")
    print("|---|---|---|---|")
    for kind, samples in clicks.items():
        p50, p95 = app_latency.percentiles(samples)
        got = click_bytes.get(kind)
        print(f"| {kind} | {p50:.1f} | {p95:.1f} | " + (f"{median(got):.2f} / {max(got):.2f}" if got else "0") + " |")
    print(f"S3 / local: first page cold {median(first['s3 cold']) / median(first['local']):.2f}x, warm "
          f"{median(first['s3 warm']) / median(first['local']):.2f}x; node click cold "
          f"{median(clicks['s3 cold']) / median(clicks['local']):.2f}x, warm "
          f"{median(clicks['s3 warm']) / median(clicks['local']):.2f}x"
          + (f"; baseline's first page cold {median(first['s3 cold, baseline']) / median(first['local']):.2f}x"
             if args.baseline_src else ""))


# -- a sweep of 1,000 trials -----------------------------------------------------------------------------------
def make_sweep(trials: int, out: Path) -> Path:
    import torch

    from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
    from comgra.recorder import ComgraRecorder
    from comgra.store.layout import escape_partition_value

    root = out / "sweep"
    group = root / "sweep"
    if (root / f"complete-{trials}").exists():
        return group
    shutil.rmtree(root, ignore_errors=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    recorder = ComgraRecorder(root, "sweep", "seed", DecisionMakerForRecordingsFrequencyPerType(1))
    recorder.track_module("main", model)
    for step in range(10):
        x = torch.randn(8, 16)
        recorder.start_batch(step, 8)
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        loss = model(x).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    files = [p for p in group.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.parts)]
    for index in range(trials):
        trial = f"trial-{index:04d}"
        for path in files:
            parts = list(path.relative_to(group).parts)
            renamed = [trial if part == "seed" else f"trial={escape_partition_value(trial)}"
                       if part == "trial=seed" else part for part in parts]
            if renamed == parts:
                continue  # not a file of the trial
            target = group.joinpath(*renamed)
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix == ".json" and path.name.startswith("trial"):
                document = json.loads(path.read_text())
                document["trial_id"] = trial
                target.write_text(json.dumps(document))
            else:
                os.link(path, target)
    for path in files:
        if "seed" in path.relative_to(group).parts or "trial=seed" in path.relative_to(group).parts:
            path.unlink()
    (root / f"complete-{trials}").write_text("")
    return group


def table_keys(location: Any, files: dict[str, tuple[int, int]], table: str) -> list[str]:
    """The Parquet objects of one table, whatever the layout (format 2: trials/<id>/<table>/*.parquet, format 3:
    <table>/trial=<id>/rank=<r>/*.parquet): the table's name is one of the key's folders."""
    return [location.key(key) for key in files if key.endswith(".parquet") and table in key.split("/")[:-1]]


def part_sweep(args: argparse.Namespace, out: Path) -> None:
    import pyarrow.dataset as ds

    from comgra.store import GroupReader
    from comgra.store.filesystems import open_location
    from comgra.store.uploader import Uploader, local_files

    started = time.perf_counter()
    group = make_sweep(args.trials, out)
    local = local_files(group)
    print(f"# sweep of {args.trials} trials: {len(local)} files, {sum(s for s, _ in local.values()) / 2**20:.1f} MiB, "
          f"made in {time.perf_counter() - started:.1f} s")
    url = bucket("bench-sweep") + "/runs/sweep"
    location = open_location(url)
    shutil.rmtree(out / "sweep-journal", ignore_errors=True)  # a fresh server: nothing of an earlier run is up
    uploader = Uploader(group, location, journal_root=out / "sweep-journal", workers=args.workers)
    started = time.perf_counter()
    result = uploader.finish(3600)
    took = time.perf_counter() - started
    print(f"\n## upload throughput ({args.workers} upload threads; {load()})")
    print(f"{uploader.total.uploaded} objects, {uploader.total.bytes / 2**20:.1f} MiB in {took:.1f} s: "
          f"{uploader.total.uploaded / took:.0f} objects/s, {uploader.total.bytes / 2**20 / took:.2f} MiB/s "
          f"(pending {result.pending})")
    started = time.perf_counter()
    files = location.list_files()
    listing = time.perf_counter() - started
    keys = table_keys(location, files, "tensors")
    print(f"\n## engines reading the tensors table of {args.trials} trials from S3 ({len(keys)} objects; one "
          f"listing of {len(files)} keys: {listing:.2f} s; {load()})")
    print("| engine | rows | seconds |")
    print("|---|---|---|")

    def timed(name: str, action: Any) -> None:
        started = time.perf_counter()
        try:
            rows = action()
        except Exception as error:  # noqa: BLE001 - a figure that could not be measured says why
            print(f"| {name} | failed: {type(error).__name__}: {str(error)[:120]} | |")
            return
        print(f"| {name} | {rows:,} | {time.perf_counter() - started:.1f} |", flush=True)

    fs = location.filesystem
    timed("pyarrow.dataset (to_table)", lambda: ds.dataset(keys, filesystem=fs, format="parquet").to_table().num_rows)

    def duckdb_count() -> int:
        import duckdb

        dataset = ds.dataset(keys, filesystem=fs, format="parquet")  # noqa: F841 - read by DuckDB
        with duckdb.connect() as con:
            return int(con.execute("SELECT count(*) FROM dataset WHERE mean IS NOT NULL OR mean IS NULL")
                       .fetchone()[0])

    timed("DuckDB over the Arrow dataset", duckdb_count)

    def polars_count() -> int:
        import polars as pl

        return int(pl.scan_pyarrow_dataset(ds.dataset(keys, filesystem=fs, format="parquet"))
                   .select(pl.len()).collect().item())

    timed("polars (scan_pyarrow_dataset)", polars_count)

    def dask_count() -> int:
        import dask.dataframe as dd

        return int(len(dd.read_parquet([f"s3://{k}" for k in keys], filesystem=fs, columns=["mean"])))

    timed("Dask (read_parquet, pyarrow filesystem)", dask_count)

    def ray_count() -> int:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        try:
            return int(ray.data.read_parquet(keys, filesystem=fs, columns=["mean"]).count())
        finally:
            ray.shutdown()

    timed("Ray Data (read_parquet, pyarrow filesystem)", ray_count)

    readers: list[Any] = []

    def comgra_mirror() -> int:
        os.environ["XDG_CACHE_HOME"] = str(out / "sweep-cache")
        shutil.rmtree(out / "sweep-cache", ignore_errors=True)
        readers.append(GroupReader(url))
        return readers[0].mirror.remote_files

    timed("comgra's GroupReader: a cold mirror of the group (rows: objects)", comgra_mirror)
    timed("comgra's GroupReader: then step 9 of every trial (from the mirror)", lambda: sum(
        readers[0].trial(t).selection(training_step=9).num_rows for t in readers[0].trials()))
    started = time.perf_counter()
    readers[0].mirror.refresh(force=True)
    print(f"| comgra's GroupReader: a refresh of the warm mirror (one listing, nothing new) | - | "
          f"{time.perf_counter() - started:.1f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", action="append", choices=["training", "app", "sweep"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--clicks", type=int, default=20)
    parser.add_argument("--scale", type=float, default=1.0, help="app: the synthetic recording's scale")
    parser.add_argument("--baseline-src", type=Path, default=None,
                        help="app: also an S3 cold start of the app of another tree's src folder (e.g. main's)")
    parser.add_argument("--compact", action="store_true",
                        help="app: compact the recording first (one large tensors object per trial)")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "comgra-object-storage-bench")
    parser.add_argument("--pin", choices=["store", "both"], default=None,
                        help="store: moto's server on the last CPU only (a bucket elsewhere does not share the "
                             "training machine's cores); both: also this process (the training, its writer and "
                             "uploader) on the other CPUs")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["XDG_CACHE_HOME"] = str(args.out / "cache")
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pinned = args.pin is not None and len(cpus) > 1
    server, endpoint = start_moto({cpus[-1]} if pinned else None)
    if pinned and args.pin == "both":
        os.sched_setaffinity(0, set(cpus[:-1]))
    print(f"# moto S3 server at {endpoint}; {load()}; {os.cpu_count()} CPUs"
          + (f"; moto's server on CPU {cpus[-1]}" if pinned else "")
          + (f", this process on {cpus[:-1]}" if pinned and args.pin == "both" else ""))
    try:
        for part in args.part or ["training", "app", "sweep"]:
            {"training": part_training, "app": part_app, "sweep": part_sweep}[part](args, args.out)
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

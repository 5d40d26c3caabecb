"""A long run: 100,000 training steps, a KPI on every step, recordings on the usual schedule.

The model is deliberately tiny (Linear(8, 16) - ReLU - Linear(16, 1), batch 8) so that what is
measured is the store, not the model. Every step calls record_kpi_in_graph; one step in ``--every``
(default 100) is recorded in full. Printed at the end, each with its verdict:

* the store is compact: files per table and merge level (the writer's tiered compaction keeps fewer
  than ``merge_every`` chunks on each level), and the most files seen during the run;
* memory is flat: RSS is sampled at every hundredth of the run; over the second half (the first holds
  the one-time costs: the first merges load Parquet's reading code, the flush interval grows with the
  run's age) the Theil-Sen slope of RSS against the step (robust to the few samples taken while a
  merge holds its parts and the merged chunk at once) is at most ``FLAT_MIB_PER_10K`` MiB per 10,000
  steps. A leak of one KPI row a step (about 120 bytes) would show as about 1.1. ``--leak-bytes-per-step``
  plants a leak, to see the verdict fail. Beside RSS: its anonymous part, glibc's heap (in use / free
  but kept), Arrow's allocator, what the writer holds until its next write ("buffered": bounded by the
  writer's ``max_buffered_bytes``; before that bound it grew with the flush interval, which grows with
  the run's age, and was the steady slope of earlier long runs), threads and files, at every tenth of
  the run. ``benchmarks/long_run_controls.py`` runs the same loop without comgra and with parts of it,
  to tell comgra's share from torch's;
* the reader (a fresh one, then the same again) and the app (``comgra --path``, then Chromium) answer
  at the end, against the app's targets (a click until the values changed: 60 / 120 ms, median / p95).

    python benchmarks/long_run.py                        # 100,000 steps
    python benchmarks/long_run.py --steps 5000 --no-app  # a quick look
    python benchmarks/long_run.py --steps 20000 --leak-bytes-per-step 200   # the verdict must say NOT flat
    python benchmarks/long_run.py --tracemalloc          # also Python's heap (about 2x slower)
"""
from __future__ import annotations

import argparse
import gc
import random
import resource
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pyarrow as pa
from scipy.stats import theilslopes

from comgra.recorder import ComgraRecorder
from comgra.store import GroupReader
from comgra.store import format as fmt
from comgra.store.writer import ChunkWriter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from long_run_controls import make_step, writer_buffer_mib  # noqa: E402
from process_memory import anonymous_resident_mib, native_heap_mib, resident_mib  # noqa: E402

FLAT_MIB_PER_10K = 0.5  # bound on the slope of RSS over the second half, MiB per 10,000 steps
CLICK_TARGET_MS = (60, 120)  # the app's target, median / p95, from a click until the values changed
MERGE_EVERY = ChunkWriter.__init__.__kwdefaults__["merge_every"]


def memory_now(trial_dir: Path, recorder: ComgraRecorder) -> dict[str, float]:
    memory = {"rss": resident_mib(), "anon": anonymous_resident_mib(), **native_heap_mib(),
              "arrow": pa.total_allocated_bytes() / 2**20, "buffered": writer_buffer_mib(recorder),
              "threads": threading.active_count(),
              "files": sum(len(fmt.chunk_names(trial_dir / table)) for table in fmt.TABLES)}
    if tracemalloc.is_tracing():
        gc.collect()
        memory["python"] = tracemalloc.get_traced_memory()[0] / 2**20
    return memory


def train(root: Path, steps: int, every: int, leak_bytes: int = 0) -> tuple[list[tuple[int, dict[str, float]]], float, float]:
    """The long run: long_run_controls's loop in mode "full" (one loop for both scripts, so the controls
    measure exactly this run), with memory sampled at every hundredth of the run. Returns the samples, and
    the wall and CPU seconds of the loop alone (building the model, the optimizer and the recorder, which
    imports torch._dynamo, comes before it; ``finalize`` after it, as in the controls)."""
    loop = make_step("full", root, every)
    marks = {steps * q // 100 - 1 for q in range(1, 101)}
    memory, leaked = [], []
    trial_dir = fmt.trial_dir(root / "long", "trial")
    began, cpu = time.perf_counter(), time.process_time()
    for step in range(steps):
        loop.step(step)
        if leak_bytes:
            leaked.append(bytearray(leak_bytes))  # the positive control: a leak the verdict must see
        if step in marks:
            memory.append((step + 1, memory_now(trial_dir, loop.recorder)))
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    loop.finish()
    return memory, seconds, cpu


def flatness(memory: list[tuple[int, dict[str, float]]], name: str = "rss") -> dict[str, float]:
    """The Theil-Sen slope (MiB per 10,000 steps, with its 95% interval) of one figure over the second half,
    and the older figures: the median of the last tenth of samples against that of the tenth before the middle."""
    second = memory[len(memory) // 2:]
    steps = [step / 10_000 for step, _ in second]
    values = [figures[name] for _, figures in second]
    slope, _, low, high = theilslopes(values, steps)
    tenth, half = max(1, len(memory) // 10), len(memory) // 2
    at_middle = statistics.median(figures[name] for _, figures in memory[half - tenth:half])
    at_end = statistics.median(figures[name] for _, figures in memory[-tenth:])
    return {"slope": slope, "low": low, "high": high, "medians": at_end - at_middle,
            "highest": max(values) - at_middle, "over_half": slope * (steps[-1] - steps[0])}


def print_memory(memory: list[tuple[int, dict[str, float]]]) -> bool:
    print(f"  memory (MiB) at every tenth of the run; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")
    for step, values in memory[9::10]:
        print(f"    {step:7d} steps: " + ", ".join(f"{name} {value:.2f}" if isinstance(value, float) else f"{name} {value}"
                                             for name, value in values.items()))
    for name in ("rss", "anon", "malloc_used", "malloc_free", "buffered", "python"):
        if name in memory[0][1]:
            flat = flatness(memory, name)
            print(f"  {name:11s} over the second half: {flat['slope']:+.2f} MiB per 10,000 steps (95%: {flat['low']:+.2f} "
                  f"to {flat['high']:+.2f}; {flat['over_half']:+.1f} MiB over the half); medians of the tenth before the "
                  f"middle and the last tenth: {flat['medians']:+.1f} MiB; highest sample {flat['highest']:+.1f} MiB")
    slope = flatness(memory)["slope"]
    verdict = slope <= FLAT_MIB_PER_10K
    # Below ~20,000 steps one 1-3 MiB step of the allocators, extrapolated to 10,000 steps, decides the verdict.
    short = " (a run this short is no test: use 20,000 steps or more)" if memory[-1][0] < 20_000 else ""
    print(f"  MEMORY: {'flat' if verdict else 'NOT flat'} (RSS {slope:+.2f} MiB per 10,000 steps over the second half; "
          f"bound {FLAT_MIB_PER_10K:+.2f}){short}")
    return verdict


def print_store(trial_dir: Path, memory: list[tuple[int, dict[str, float]]]) -> bool:
    """Files per table and merge level. Compact: no level holds ``MERGE_EVERY`` chunks (the writer merges them)."""
    compact, total_files, total_bytes = True, 0, 0
    for table in fmt.TABLES:
        files = fmt.chunk_files(trial_dir / table)
        levels: dict[int, int] = {}
        for path in files:
            level = fmt.parse_chunk_name(path.name).level  # type: ignore[union-attr]
            levels[level] = levels.get(level, 0) + 1
        compact = compact and all(count < MERGE_EVERY for count in levels.values())
        size = sum(f.stat().st_size for f in files)
        total_files, total_bytes = total_files + len(files), total_bytes + size
        print(f"  {table:9s} {len(files):4d} files {size / 2**20:8.2f} MiB  (chunks per merge level: "
              f"{dict(sorted(levels.items()))})")
    everything = [p for p in trial_dir.rglob("*") if p.is_file()]
    most = max(int(figures["files"]) for _, figures in memory)
    print(f"  all chunks {total_files:3d} files {total_bytes / 2**20:8.2f} MiB; every file of the trial: {len(everything)}; "
          f"the most chunks at one sample during the run: {most}")
    print(f"  STORE: {'compact' if compact else 'NOT compact'} (every table holds fewer than {MERGE_EVERY} chunks "
          "per merge level)")
    return compact


def timed(call):
    began = time.perf_counter()
    result = call()
    return result, (time.perf_counter() - began) * 1000


def print_reader(group: Path) -> None:
    for label in ("fresh reader", "same reader"):
        trial = GroupReader(group).trial("trial") if label == "fresh reader" else trial
        index, index_ms = timed(trial.steps)
        last = index["training_step"].to_pylist()[-1]
        selection, selection_ms = timed(lambda: trial.selection(training_step=last))
        series, series_ms = timed(lambda: trial.series(node="out", role="out", iteration=0))
        kpis, kpis_ms = timed(trial.kpis)
        print(f"  {label}: step index {index_ms:.0f} ms ({index.num_rows} steps), selection {selection_ms:.0f} ms "
              f"({selection.num_rows} rows), series {series_ms:.0f} ms ({series.num_rows} points), "
              f"KPIs {kpis_ms:.0f} ms ({kpis.num_rows} points)")


def app_latencies(group: Path, repeats: int, browser: bool) -> dict[str, list[float]]:
    """The app (``comgra --path``, no findings scan) on a finished recording: the server's answers, then
    clicks in Chromium timed in the page, from the click until the values changed."""
    import app_latency

    process, url, startup = app_latency.start_server(group)
    try:
        client = app_latency.DashClient(*app_latency.urllib_transport(url.rstrip("/")))
        client.trigger(app_latency.VIEW_OUTPUT)
        nodes, rng = [n["id"] for n in client.graph()["nodes"]], random.Random(0)
        results: dict[str, list[float]] = {
            "start until served": [startup * 1000],
            "server: values route, node click": [app_latency.timed(lambda: client.click_values(rng.choice(nodes)))
                                                 for _ in range(repeats)],
            "server: values route, next step": app_latency.next_steps(client, repeats),
            "server: series plot, a new tensor": [app_latency._series_after(client, rng, {"node-click.data": {
                "id": rng.choice(nodes), "t": time.time()}}, "mean") for _ in range(repeats)],
            "server: KPI graphs tab (every KPI point)": [app_latency.timed(lambda: client.trigger(
                "kpi-graphs.children", {"tabs.active_tab": "graphs"})) for _ in range(max(3, repeats // 4))],
        }
        if browser:
            results.update(browser_clicks(url, repeats))
    finally:
        process.terminate()
        process.wait(10)
    return results


def browser_clicks(url: str, repeats: int) -> dict[str, list[float]]:
    """Node clicks and next-step clicks in Chromium at 1280x800, timed in the page (app_latency's timer) from the
    click until the values changed. Every click changes what is shown: after an untimed click on the first node,
    the clicks go round the others (the graph of this model has a handful of nodes)."""
    import app_latency
    from playwright.sync_api import sync_playwright

    results: dict[str, list[float]] = {"Chromium: node click until the values changed": [],
                                       "Chromium: next step until the values changed": []}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=app_latency.CHROMIUM, args=app_latency.CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.add_init_script(app_latency.PAGE_TIMER)
        page.goto(url)
        page.wait_for_selector("#series-plot .js-plotly-plot")
        nodes = page.locator("#dependency-graph [data-node]").evaluate_all("els => els.map(e => e.dataset.node)")
        node = '#dependency-graph [data-node="{}"]'.format
        page.click(node(nodes[0]))
        page.wait_for_timeout(app_latency.PAUSE_MS)
        for i in range(repeats):
            results["Chromium: node click until the values changed"].append(
                app_latency._click_until_values_change(page, node(nodes[1 + i % (len(nodes) - 1)])))
            results["Chromium: next step until the values changed"].append(
                app_latency._click_until_values_change(page, "#step-next"))
        browser.close()
    return results


def print_app(long_group: Path, short_group: Path, repeats: int, browser: bool) -> bool | None:
    """The app at the end of the long run beside the app on a short run of the same model, measured one after
    the other: on a loaded machine the ratio says whether the long run made the app slower."""
    import app_latency

    long, short = app_latencies(long_group, repeats, browser), app_latencies(short_group, repeats, browser)
    print("  app at the end of the run, median / p95 ms (a short run of the same model beside it):")
    for name, samples in long.items():
        (p50, p95), (s50, s95) = app_latency.percentiles(samples), app_latency.percentiles(short[name])
        print(f"    {name:45s} {p50:6.0f} / {p95:5.0f}   short run {s50:6.0f} / {s95:5.0f}   ratio {p50 / s50:.2f}x")
    if not browser:
        return None
    met = all(app_latency.percentiles(long[f"Chromium: {name} until the values changed"])[0] <= CLICK_TARGET_MS[0]
              and app_latency.percentiles(long[f"Chromium: {name} until the values changed"])[1] <= CLICK_TARGET_MS[1]
              for name in ("node click", "next step"))
    print(f"  APP: {'within' if met else 'NOT within'} the target in Chromium ({CLICK_TARGET_MS[0]} / "
          f"{CLICK_TARGET_MS[1]} ms, median / p95)")
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=100, help="record one step in this many (default: 100)")
    parser.add_argument("--root", type=Path, help="where to record (default: a new temporary folder)")
    parser.add_argument("--tracemalloc", action="store_true", help="also trace Python's heap (about 2x slower)")
    parser.add_argument("--leak-bytes-per-step", type=int, default=0, help="plant a leak (a positive control)")
    parser.add_argument("--repeats", type=int, default=20, help="clicks per kind in the app (default: 20)")
    parser.add_argument("--no-app", action="store_true", help="skip the app at the end")
    parser.add_argument("--reference-steps", type=int, default=5000,
                        help="the short run the app is compared with (default: 5,000 steps)")
    parser.add_argument("--app-only", action="store_true", help="only the app, on the recordings in --root")
    parser.add_argument("--no-browser", action="store_true", help="time the app's server only, not Chromium")
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="comgra-long-run-"))
    if args.app_only:  # the app on the recordings an earlier run of this script left in --root
        print_app(root / "long", root / "short" / "long", args.repeats, not args.no_browser)
        return
    if args.tracemalloc:
        tracemalloc.start()

    began, cpu = time.perf_counter(), time.process_time()
    memory, loop_seconds, loop_cpu = train(root, args.steps, args.every, args.leak_bytes_per_step)
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    print(f"{args.steps} steps, 1 in {args.every} recorded, a KPI every step: {seconds:.1f} s wall, {cpu:.1f} s CPU "
          f"({seconds / args.steps * 1e6:.0f} us/step; the loop alone {loop_seconds / args.steps * 1e6:.0f} us/step, "
          f"CPU of every thread {loop_cpu / args.steps * 1e6:.0f} us/step) "
          f"into {root}")
    compact = print_store(fmt.trial_dir(root / "long", "trial"), memory)
    flat = print_memory(memory)
    print_reader(root / "long")
    app = None
    if not args.no_app:
        short = root / "short"
        train(short, args.reference_steps, args.every)  # the app's reference recording
        try:
            app = print_app(root / "long", short / "long", args.repeats, not args.no_browser)
        except Exception as error:  # noqa: BLE001 - the memory and store verdicts above still stand
            print(f"  APP: not measured ({type(error).__name__}: {str(error).splitlines()[0]}); "
                  f"python benchmarks/long_run.py --root {root} --app-only measures it again")
    print(f"VERDICT: store {'compact' if compact else 'NOT compact'}, memory {'flat' if flat else 'NOT flat'}"
          + ("" if app is None else f", app {'within' if app else 'NOT within'} its target"))


if __name__ == "__main__":
    main()

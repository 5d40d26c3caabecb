"""Figures of the Runs view and of the app over a large group (issue 30), before and after, side by side.

    python benchmarks/runs_view.py                 # 100 and 1,000 trials, groups written once to benchmarks/out
    python benchmarks/runs_view.py --trials 100    # one size only

Printed, each measured in this one run (before and after interleaved, medians of ``--repeat``):

- the app's poll (``data_version``) and start-up listing: *before* is the algorithm this replaced (three chunk
  listings per trial on every poll, ``service.trials`` before issue 30), *after* ``service.changes``;
- ``GET /trials/<t>/kpis`` of a 20,000-step trial: every point (``max_points=0``, the answer before) and the
  default answer (each curve cut to 2,000 points, keeping every bucket's extremes);
- the Runs view in Chromium at 1280x800 (``--browser``, on by default): from clicking the tab on a freshly
  started app (a process of its own), never scanned, to the first rows drawn, four ways (``FIRST_PAGE_MODES``:
  first open, a group no app opened before (no runs summary), the rows computed at the click; cold, the same over
  a group an app opened before (its runs summary kept); at once, as ``comgra serve`` opens it, clicked at once;
  served, clicked once the first page settled), with the server's CPU over that time and the load average at the
  click; the regex filter (typing to the rows shown) and a
  sort (clicking a header to the rows reordered). With ``--baseline-src`` every one of them also for those sources,
  interleaved with this checkout's:

    git archive a311d6b src | tar -x -C /tmp/base
    python benchmarks/runs_view.py --trials 1000 --browser-only --repeat 2 --baseline-src /tmp/base/src

The load average is printed with the figures: on a shared machine they are noisy, the ratios less so.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import sweep_group  # noqa: E402

from comgra.server.app import create_app  # noqa: E402
from comgra.service import RecordingService  # noqa: E402
from comgra.store.reader import GroupReader  # noqa: E402

OUT = HERE / "out"


def old_data_version(group: GroupReader) -> str:
    """The poll before issue 30 (TrialQuestions.data_version): every trial's chunks of three tables listed."""
    parts = []
    for trial_id in group.trials():
        counts = [len(group.chunk_names(trial_id, table)) for table in ("steps", "kpis", "notes")]
        parts.append(f"{trial_id}:{counts}")
    return "|".join(parts)


def median_ms(action, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def polls(group_dir: Path, repeat: int) -> None:
    service = RecordingService(group_dir)
    group = GroupReader(group_dir)
    try:
        before_first = median_ms(lambda: old_data_version(GroupReader(group_dir)), 1)
        after_first = median_ms(lambda: RecordingService(group_dir).data_version(), 1)
        before, after = [], []
        for _ in range(repeat):  # interleaved
            before.append(median_ms(lambda: old_data_version(group), 1))
            after.append(median_ms(service.data_version, 1))
        trials = len(group.trials())
        print(f"  app start-up listing, {trials} trials: before {before_first:8.1f} ms   after {after_first:8.1f} ms")
        print(f"  poll (data_version), {trials} trials:   before {statistics.median(before):8.1f} ms   "
              f"after {statistics.median(after):8.1f} ms   ({service.trial_questions.changes.listings} chunk listings)")
    finally:
        service.close()


def old_summaries(group_dir: Path) -> int:
    """The KPI part of the Runs rows before the one query (service/run_summaries.py): each trial's reader, read and
    summarised one by one."""
    from comgra.service.runs import kpi_summary

    group = GroupReader(group_dir)
    return sum(len(kpi_summary(group.trial(t).kpis())) for t in group.trials())


def new_summaries(group_dir: Path) -> int:
    from comgra.service.run_summaries import kpi_summaries
    from comgra.service.runs import _kpi_files

    group = GroupReader(group_dir)
    found = kpi_summaries({t: _kpi_files(group.trial(t)) for t in group.trials()})
    return sum(len(s.kpis) for s in (found or {}).values())


def first_answer(group_dir: Path, repeat: int) -> None:
    """The service's first Runs answer (every row computed), and its KPI part before and after, interleaved; wall
    and CPU (process_time: Arrow's threads too)."""
    timings: dict[str, list[tuple[float, float]]] = {"old KPI summaries": [], "new KPI summaries": [],
                                                      "service.runs(), cold": []}

    def cold_runs() -> None:
        service = RecordingService(group_dir)
        try:
            service.runs()
        finally:
            service.close()

    for _ in range(repeat):
        for name, action in (("old KPI summaries", lambda: old_summaries(group_dir)),
                             ("new KPI summaries", lambda: new_summaries(group_dir)),
                             ("service.runs(), cold", cold_runs)):
            wall, cpu = time.perf_counter(), time.process_time()
            action()
            timings[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    for name, values in timings.items():
        print(f"  {name:<22} wall {statistics.median(v[0] for v in values) * 1e3:7.0f} ms   CPU "
              f"{statistics.median(v[1] for v in values) * 1e3:7.0f} ms (medians of {len(values)})")


def kpis(group_dir: Path, repeat: int) -> None:
    app = create_app(group_dir, warm_up=False)
    client = app.server.test_client()
    url = "/api/v1/trials/trial_00000/kpis"
    client.get(url)
    every, cut = [], []
    for _ in range(repeat):
        every.append(median_ms(lambda: client.get(url, query_string={"max_points": 0}), 1))
        cut.append(median_ms(lambda: client.get(url), 1))
    rows = len(client.get(url).get_json()["kpis"])
    print(f"  /kpis of a 20,000-step trial (2 curves): every point {statistics.median(every):7.1f} ms   "
          f"default ({rows} points) {statistics.median(cut):7.1f} ms")
    app.server.config.clear()


# Clocks in the page: the input event and the mouse press are seen first (window, capturing), the count's text and the
# sort arrow when they change (MutationObserver).
_IN_PAGE_CLOCKS = """() => {
    const clocks = window.__clocks = {};
    window.addEventListener('input', () => { clocks.input = performance.now(); }, true);
    window.addEventListener('mousedown', () => { clocks.press = performance.now(); }, true);
    new MutationObserver(() => { clocks.count = performance.now(); }).observe(
        document.querySelector('#runs-count'), {childList: true, characterData: true, subtree: true});
    new MutationObserver(() => { clocks.sorted = performance.now(); }).observe(
        document.querySelector("#runs-grid .ag-header-cell[col-id='steps']"), {attributes: true,
                                                                               attributeFilter: ['aria-sort']});
}"""


# The ways a first page of the Runs tab is timed, alternated in one run:
#   "first open": as "cold", over a group without a runs summary (GROUP/.runs-summary.parquet, removed before): no app
#           opened it before, every row is computed at the click (the app then keeps them there);
#   "cold": an app made with warm_up=False, the tab clicked as soon as the tabs are on the page: the rows are asked for
#           at the click, while the app's own first page is still being answered (over a group an app opened before:
#           the rows of the trials that did not change since come from its runs summary);
#   "first at once": as "at once" (below), over a group no app opened before: ``comgra``'s first start on a new sweep;
#   "at once": the app as ``comgra serve`` makes it (warm_up=True: the Runs rows are computed after the first page's
#           question), the tab clicked as soon as the tabs are on the page;
#   "served": the same app, the tab clicked once the first page settled (no request for 1 s, or 30 s at most).
FIRST_PAGE_MODES = ("first open", "first at once", "cold", "at once", "served")

# The app in a process of its own, from the sources on its PYTHONPATH (this checkout's, or --baseline-src): it prints
# its address, then serves until killed. Its findings scan runs as ``comgra`` runs it (``--scan child``: in a child
# process, ``cli/app.py``) or in the server's own threads (``--scan in-process``: ``create_app``'s default, for an app
# made in a notebook or a script), where importing the detectors' libraries holds the interpreter for about a second.
_SERVER = """
import sys
from comgra.server.app import create_app, make_http_server, url_of
app = create_app(sys.argv[1], warm_up=sys.argv[2] == "1", poll_seconds=600, scan_in_child=sys.argv[3] == "child")
server = make_http_server(app, port=0)
print(url_of(server), flush=True)
server.serve_forever()
"""


def _forget_findings(group_dir: Path) -> None:
    """The saved findings removed, so that the app scans the group again. The trial folders' analysis folders are
    emptied, not removed: removing them would change every trial folder (a new modification time), and a trial
    folder that changed is a trial whose runs summary row is out of date."""
    import shutil

    for path in group_dir.glob("trials/*/analysis/*"):
        path.unlink()
    shutil.rmtree(group_dir / "findings", ignore_errors=True)


def _settled(page, quiet_s: float = 1.0, at_most_s: float = 30.0) -> float:
    """Wait until the page made no Dash request for ``quiet_s`` (the start-here strip polls while a scan runs); the
    seconds waited."""
    last = [time.perf_counter()]
    page.on("request", lambda request: last.__setitem__(0, time.perf_counter()))
    started = time.perf_counter()
    while time.perf_counter() - last[0] < quiet_s and time.perf_counter() - started < at_most_s:
        page.wait_for_timeout(100)
    return time.perf_counter() - started


SCAN = ["child"]  # --scan: where the app's findings scan runs
MODES = list(FIRST_PAGE_MODES)  # --modes: the ways the first page is timed


def _started_server(group_dir: Path, sources: Path, warm_up: bool) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-c", _SERVER, str(group_dir), "1" if warm_up else "0", SCAN[0]],
                               env={**os.environ, "PYTHONPATH": str(sources)}, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    return process, process.stdout.readline().strip() if process.stdout else ""


def _process_cpu(process: subprocess.Popen) -> float:
    """The CPU seconds (user + system, all threads) of a running process so far."""
    fields = Path(f"/proc/{process.pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def browser(group_dir: Path, repeat: int, versions: dict[str, Path]) -> None:
    """Each version's app (name -> its sources) in a process of its own, the versions and modes interleaved."""
    from playwright.sync_api import sync_playwright

    first: dict[tuple[str, str], list[float]] = {(v, m): [] for v in versions for m in FIRST_PAGE_MODES}
    loads: dict[tuple[str, str], list[float]] = {(v, m): [] for v in versions for m in FIRST_PAGE_MODES}
    cpu: dict[tuple[str, str], list[float]] = {(v, m): [] for v in versions for m in FIRST_PAGE_MODES}
    measured: dict[str, dict[str, list[float]]] = {v: {"filter": [], "sort": [], "in filter": [], "in sort": []}
                                                   for v in versions}
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                              args=["--no-sandbox", "--disable-gpu"])
        try:
            for _ in range(repeat):
                for mode in MODES:
                    for version, sources in versions.items():  # interleaved
                        _forget_findings(group_dir)  # each app opens the group as never scanned
                        summary, aside = group_dir / ".runs-summary.parquet", group_dir / ".runs-summary.aside"
                        if mode.startswith("first") and summary.exists():
                            summary.replace(aside)  # back after the run if this app kept none (older sources)
                        process, url = _started_server(group_dir, sources, warm_up=mode not in ("cold", "first open"))
                        try:
                            page = chromium.new_context(viewport={"width": 1280, "height": 800}).new_page()
                            page.set_default_timeout(120_000)
                            page.goto(url)
                            page.wait_for_selector("#tabs")
                            if mode == "served":
                                _settled(page)
                            loads[version, mode].append(os.getloadavg()[0])
                            started, server_cpu = time.perf_counter(), _process_cpu(process)
                            page.get_by_role("tab", name="Runs").click()
                            page.wait_for_selector("#runs-grid .ag-center-cols-container .ag-row")
                            first[version, mode].append(time.perf_counter() - started)
                            cpu[version, mode].append(_process_cpu(process) - server_cpu)
                            if mode == "cold":
                                found = measured[version]
                                _filter_and_sort(page, group_dir, found["filter"], found["sort"], found["in filter"],
                                                 found["in sort"])
                            page.context.close()
                        finally:
                            process.kill()
                            process.wait()
                            if aside.exists() and not summary.exists():
                                aside.replace(summary)
                            aside.unlink(missing_ok=True)
        finally:
            chromium.close()
    names = list(versions)
    print("  Runs view in Chromium at 1280x800, driver-timed, from the click on the tab to the first rows drawn "
          f"(medians of {repeat}; the server's CPU-s over that time):")
    for mode in MODES:
        print(f"    first page, {mode:<14}" + "   ".join(
            f"{v} {statistics.median(first[v, mode]) * 1e3:6.0f} ms (CPU {statistics.median(cpu[v, mode]):4.2f} s; "
            "each " + " ".join(f"{x:.2f}" for x in first[v, mode]) + "; load "
            + " ".join(f"{x:.1f}" for x in loads[v, mode]) + ")" for v in names))
    for name, key in (("filter", "filter"), ("sort", "sort"), ("filter in the page", "in filter"),
                      ("sort in the page", "in sort")):
        if "cold" not in MODES:  # the filter and the sort are timed in the "cold" app
            break
        print(f"    {name:<19}" + "   ".join(
            f"{v} {statistics.median(measured[v][key]) * 1e3:5.0f} ms (each "
            + " ".join(f"{x * 1e3:.0f}" for x in measured[v][key]) + ")" for v in names))
    if "cold" in MODES:
        print("  (in the page: performance.now() from the input event or the mouse press to the count or the sort "
              "arrow changed)")


def _filter_and_sort(page, group_dir: Path, filters: list, sorts: list, inside_filters: list,
                     inside_sorts: list) -> None:
    page.evaluate(_IN_PAGE_CLOCKS)
    total = len(RecordingService(group_dir).trials())
    for text, expected in (("lr=0\\.01$", f"{total // 5} of {total} trials"), ("", f"{total} trials")):
        started = time.perf_counter()
        page.fill("#runs-filter", text)
        page.wait_for_function(f"() => document.querySelector('#runs-count').textContent"
                               f" === {expected!r}", polling="raf")
        filters.append(time.perf_counter() - started)
        inside_filters.append(page.evaluate("window.__clocks.count - window.__clocks.input") / 1e3)
    header = "#runs-grid .ag-header-cell[col-id='steps']"
    for direction in ("ascending", "descending"):
        started = time.perf_counter()
        page.click(header)
        page.wait_for_function(f"() => document.querySelector(\"{header}\").getAttribute('aria-sort')"
                               f" === '{direction}'", polling="raf")
        sorts.append(time.perf_counter() - started)
        inside_sorts.append(page.evaluate("window.__clocks.sorted - window.__clocks.press") / 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, nargs="*", default=[100, 1000])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--browser-only", action="store_true", help="the browser's figures only (at 1,000 trials)")
    parser.add_argument("--baseline-src", type=Path, help="the browser's figures also for these sources (e.g. "
                        "`git archive a311d6b src | tar -x -C /tmp/base`, then /tmp/base/src), interleaved")
    parser.add_argument("--modes", nargs="+", choices=FIRST_PAGE_MODES, default=list(FIRST_PAGE_MODES),
                        help="the ways the first page is timed (default: all)")
    parser.add_argument("--scan", choices=("child", "in-process"), default="child",
                        help="where the app's findings scan runs: in a child process, as `comgra` serves (default), or "
                             "in the server's threads, as create_app() makes the app by default")
    args = parser.parse_args()
    SCAN[0] = args.scan
    MODES[:] = args.modes
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} at start, {os.cpu_count()} cores; "
          f"the findings scan {args.scan}")
    for trials in args.trials:
        group_dir = sweep_group.write_group(OUT / f"sweep{trials}", trials, 50)
        print(f"{trials} trials ({group_dir}):")
        if not args.browser_only:
            polls(group_dir, args.repeat)
            first_answer(group_dir, args.repeat)
        if not args.no_browser and trials >= 1000:
            versions = {"new": HERE.parent / "src", **({"old": args.baseline_src} if args.baseline_src else {})}
            browser(group_dir, max(1, args.repeat // 2), versions)
    if not args.browser_only:
        kpis(sweep_group.write_group(OUT / "long20000", 1, 20_000), args.repeat)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()

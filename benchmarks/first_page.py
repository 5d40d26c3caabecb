"""How long the app's first page takes, and how many callbacks it fires, this tree against another comgra.

For each graph size (``--nodes``, the synthetic recordings of ``app_latency.py``) it starts two servers,
``--baseline-src`` (e.g. ``git archive main src | tar -x -C /tmp/main``) and this tree, and loads each one's
first page in turn, ``--repeats`` times, each load in a fresh browser context at 1280x800 (interleaved, so that
both see the same load on the machine). Per load:

* ``values shown``: from navigation start until the values panel shows a mean (``#stat-mean``): what
  ``app_latency.py`` calls "page load", the issue's "first page";
* ``series drawn``: until the series plot below the values is drawn (Plotly loaded and run);
* ``callbacks``: the ``/_dash-update-component`` requests the page sent until values were shown and until the
  series was drawn (each request is one server-side callback firing);
* ``renderer CPU``: the page's main-thread task time until the series was drawn (Chromium's ``TaskDuration``:
  dash-renderer, React, Plotly and comgra's script), beside the wall time;
* ``server CPU``: the server process's CPU time during the load (/proc);
* the layout's JSON size (``/_dash-layout``) and the number of callbacks the app declares.

It prints the load average before and after, and medians side by side with their ratio.

    python benchmarks/first_page.py --baseline-src /tmp/main/src --nodes 15 --nodes 100 --nodes 1000 --repeats 7
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import app_latency  # noqa: E402  (the recordings and the server start are shared)

SRC = HERE.parent / "src"
WATCH = """
window.__fp = {inflight: 0, asked: 0, askedAtValues: null, values: null, series: null, askedAtSeries: null, outputs: []};
const __fetch = window.fetch;
window.fetch = function(url, options) {
  const isCallback = String(url).includes('_dash-update-component');
  if (!isCallback) return __fetch.apply(this, arguments);
  window.__fp.inflight += 1; window.__fp.asked += 1;
  try { window.__fp.outputs.push(JSON.parse(options.body).output); } catch (e) {}
  return __fetch.apply(this, arguments).finally(() => { window.__fp.inflight -= 1; });
};
new MutationObserver(() => {
  if (window.__fp.values === null && document.getElementById('stat-mean')) {
    window.__fp.values = performance.now(); window.__fp.askedAtValues = window.__fp.asked;
  }
  if (window.__fp.series === null && document.querySelector('#series-plot .js-plotly-plot')) {
    window.__fp.series = performance.now(); window.__fp.askedAtSeries = window.__fp.asked;
  }
}).observe(document, {childList: true, subtree: true});
"""
SETTLED = "() => window.__fp.values !== null && window.__fp.series !== null"


def cpu_seconds(pid: int) -> float:
    """The user + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_once(browser: Any, url: str, pid: int) -> dict[str, Any]:
    server_cpu = cpu_seconds(pid)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.add_init_script(WATCH)
    cdp = context.new_cdp_session(page)
    cdp.send("Performance.enable")
    page.goto(url)
    page.wait_for_function(SETTLED, timeout=120_000, polling=50)
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    state = page.evaluate("window.__fp")
    server_cpu = cpu_seconds(pid) - server_cpu
    context.close()
    return {"values shown (ms)": state["values"], "series drawn (ms)": state["series"],
            "callbacks until values": state["askedAtValues"], "callbacks until the series": state["askedAtSeries"],
            "renderer CPU until the series (ms)": metrics.get("TaskDuration", 0) * 1000,
            "server CPU until the series (ms)": server_cpu * 1000, "outputs": state["outputs"]}


def layout_size(url: str) -> tuple[int, int]:
    layout = urllib.request.urlopen(url.rstrip("/") + "/_dash-layout", timeout=60).read()
    dependencies = json.loads(urllib.request.urlopen(url.rstrip("/") + "/_dash-dependencies", timeout=60).read())
    return len(layout), len(dependencies)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, required=True, help="the src folder of the comgra to compare with")
    parser.add_argument("--nodes", type=int, action="append", help="graph size, repeatable (default 15)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=HERE / "out")
    parser.add_argument("--show-outputs", action="store_true", help="print the callbacks' outputs of the last load")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    print(f"# {time.strftime('%H:%M:%S', time.gmtime())} UTC, load average {os.getloadavg()}", flush=True)
    sides = [("baseline", args.baseline_src.resolve()), ("this tree", SRC)]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=app_latency.CHROMIUM, args=app_latency.CHROMIUM_ARGS)
        for nodes in args.nodes or [15]:
            group = app_latency.recording_for(1.0, args.out, nodes)
            servers = {label: app_latency.start_server(group, source) for label, source in sides}
            try:
                results: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in sides}
                for label, (process, url, _) in servers.items():  # one untimed load each: the servers' warm-up
                    load_once(browser, url, process.pid)
                for _ in range(args.repeats):
                    for label, (process, url, _) in servers.items():
                        results[label].append(load_once(browser, url, process.pid))
                sizes = {label: layout_size(url) for label, (_, url, _) in servers.items()}
            finally:
                for process, _, _ in servers.values():
                    process.terminate()
                    process.wait(10)
            print(f"\n## {nodes} nodes, {args.repeats} loads each, interleaved; load average {os.getloadavg()}")
            print("| measurement (median, min-max) | baseline | this tree | ratio |\n|---|---|---|---|")
            for key in [k for k in results["baseline"][0] if k != "outputs"]:
                a, b = ([r[key] for r in results[label]] for label, _ in sides)
                ma, mb = statistics.median(a), statistics.median(b)
                print(f"| {key} | {ma:.0f} ({min(a):.0f}-{max(a):.0f}) | {mb:.0f} ({min(b):.0f}-{max(b):.0f}) | "
                      f"{mb / ma if ma else float('nan'):.2f} |")
            for label, _ in sides:
                size, count = sizes[label]
                print(f"| {label}: layout JSON {size / 1024:.0f} KiB, {count} callbacks declared | | | |")
            if args.show_outputs:
                for label, _ in sides:
                    print(f"# {label} fired: {results[label][-1]['outputs']}")
        browser.close()
    print(f"\n# ended {time.strftime('%H:%M:%S', time.gmtime())} UTC, load average {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

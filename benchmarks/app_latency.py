"""How fast the app answers, in the browser and on the server, and what the server holds in memory.

For each graph size (``--nodes``: 15 is the tutorial's network, more a
transformer of blocks of attention + MLP with a node per parameter) and scale
it writes a synthetic recording (cached under --out), starts
``comgra --path`` as a subprocess (timing the start), then measures:

* server: the time of an HTTP POST to /_dash-update-component, per kind of
  interaction (node click, step change, aggregation, iteration, trial), and
  of the series plot, which reads every recorded step of one tensor (a new
  tensor: all chunks are read; the same tensor at another step: cached);
* browser (Playwright + Chromium), timed inside the page: from navigation start
  until the values are shown, and from a click on a node / the next-step button
  until the values element changed (with a pause between clicks, as a user makes);
  a node click's values come from the values route (``/_comgra/values``), timed
  on the server as "node click: values route", the rest from the view callback;
  each node click is also split into phases from the page's Resource Timing (until the request left,
  queued, server + network, download, answer until drawn) and its main thread's long tasks;
  ``--series-off-too`` times the clicks also with the series plot switched off (its callback answered
  "no update" in the browser), side by side with it on, before and after; ``--draw-all-too`` times them
  also with the whole graph drawn (``window.COMGRA_DRAW_ALL``, as before the graph drew only what is in
  view), side by side with the default, before and after; a node out of view is scrolled to (untimed)
  before the pause that precedes its click;
* the server runs with ``--no-findings-scan``: no findings scan runs beside the clicks (a scan reads
  every chunk once, and costs minutes on the largest recordings). ``--findings-scan`` lets the server
  scan as it does by default, and times the clicks once every trial's scan has finished.
* server RSS after visiting 0, 100, 300 ... training steps (no cache grows
  with the steps visited).

    python benchmarks/app_latency.py                     # 15 nodes, scales 1 and 50
    python benchmarks/app_latency.py --nodes 15 --nodes 40 --nodes 200 --nodes 1000 --scale 1 --scale 50
    python benchmarks/app_latency.py --scale 1 --repeats 10 --no-browser
    python benchmarks/app_latency.py --nodes 1000 --scale 50 --repeats 25 --no-rss --no-server --series-off-too
    python benchmarks/app_latency.py --nodes 1000 --scale 50 --repeats 15 --no-rss --no-server --draw-all-too
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
VIEW_OUTPUT = "selection.data"
PANELS_BUILT = "panels-built.data"  # comgra.server.ids.ID.PANELS_BUILT: the callback that builds a tab's panel
VALUES_ROUTE = "/_comgra/values"  # comgra.server.tensors.VALUES_ROUTE


# -- a Dash client over HTTP ---------------------------------------------------------------------------
class DashClient:
    """Plays the browser's part of Dash: keeps component props, posts callback requests.

    ``get_json(path)`` and ``post_json(path, payload)`` do the HTTP; any transport works
    (urllib against a running server, Flask's test client in tests).
    """

    def __init__(self, get_json: Callable[[str], Any], post_json: Callable[[str, Any], Any]):
        self._post = post_json
        self.props: dict[tuple[str, str], Any] = {}
        _collect_props(get_json("/_dash-layout"), self.props)
        self.callbacks = [c for c in get_json("/_dash-dependencies") if not c.get("clientside_function")]

    def trigger(self, output: str, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run the callback whose output mentions ``output``, as if ``changes`` ("id.prop": value) happened."""
        changes = changes or {}
        for key, value in changes.items():
            self.props[tuple(key.rsplit(".", 1))] = value
        if "tabs.active_tab" in changes and output != PANELS_BUILT:  # as the page does: the tab's panel first
            self.trigger(PANELS_BUILT, {"tabs.active_tab": changes["tabs.active_tab"]})
        callback = next((c for c in self.callbacks if output in _output_names(c["output"])), None) or \
            next(c for c in self.callbacks if output in c["output"])
        payload = {
            "output": callback["output"], "outputs": _outputs(callback["output"]),
            "inputs": [self._with_value(d) for d in callback["inputs"]],
            "state": [self._with_value(d) for d in callback["state"]],
            "changedPropIds": list(changes),
        }
        response = self._post("/_dash-update-component", payload) or {}
        for component, props in (response.get("response") or {}).items():
            for prop, value in props.items():
                self.props[(component, prop)] = _patched(self.props.get((component, prop)), value)
                if prop == "children":  # components built by a callback (a tab's panel) join the page
                    _collect_props(value, self.props)
        return response

    def _with_value(self, dependency: dict[str, Any]) -> dict[str, Any]:
        key = (dependency["id"], dependency["property"])
        return {**dependency, **({"value": self.props[key]} if key in self.props else {})}

    def click_values(self, node_id: str) -> dict[str, Any]:
        """What the page asks first on a node click: the values route (outside Dash's callback queue)."""
        return self._post(VALUES_ROUTE, {"selection": self.props.get(("selection", "data")), "node_id": node_id})

    def step_values(self, trigger: str) -> dict[str, Any]:
        """What the page asks first on a click on the previous / next step button ("step_prev", "step_next")."""
        return self._post(VALUES_ROUTE, {"selection": self.props.get(("selection", "data")), "trigger": trigger})

    def hover_cards(self) -> dict[str, Any]:
        """The hover cards' numbers, asked by the page after every step change (this reads the whole step)."""
        return self.trigger("node-summaries.data", {"step-key.data": self.props.get(("step-key", "data"))})

    def statistics(self) -> dict[str, float | None]:
        """The statistics the values panel shows, read from the data-value attributes."""
        values = self.props.get(("values-data", "data")) or {}
        return {stat["name"]: _number(stat["value"]) for stat in values.get("stats") or []}

    def shown(self) -> dict[str, Any] | None:
        return (self.props.get(("selection", "data")) or {}).get("shown")

    def graph(self) -> dict[str, Any] | None:
        """The document of the graph shown, from the page's store of graphs (sent once per hash)."""
        key = self.props.get(("graph-key", "data")) or {}
        return (self.props.get(("graph-documents", "data")) or {}).get(key.get("hash"))


def _patched(current: Any, value: Any) -> Any:
    """A prop after a response: the value, or ``current`` with a Dash ``Patch``'s operations applied."""
    if not (isinstance(value, dict) and value.get("__dash_patch_update")):
        return value
    result = json.loads(json.dumps(current)) if current is not None else None
    for operation in value.get("operations", []):
        name, location, params = operation["operation"], operation["location"], operation["params"]
        if result is None:
            result = [] if name in ("Append", "Extend") else {}
        target = result
        for key in location[:-1] if name == "Assign" else location:
            target = target[key]
        if name == "Assign":
            target[location[-1]] = params["value"]
        elif name == "Append":
            target.append(params["value"])
        elif name == "Extend":
            target.extend(params["value"])
        else:
            raise NotImplementedError(f"Patch operation {name!r}")
    return result


def _output_names(spec: str) -> list[str]:
    """The "id.prop" of each output of a callback's output spec (without an allow_duplicate's "@hash")."""
    return [part.split("@")[0] for part in spec.strip(".").split("...")]


def _outputs(spec: str) -> Any:
    if not spec.startswith(".."):
        component, prop = spec.rsplit(".", 1)
        return {"id": component, "property": prop}
    return [dict(zip(("id", "property"), part.rsplit(".", 1))) for part in spec.strip(".").split("...")]


def _collect_props(node: Any, props: dict[tuple[str, str], Any]) -> None:
    for item in _walk_props(node):
        if isinstance(item.get("id"), str):
            for name, value in item.items():
                if name != "children":
                    props[(item["id"], name)] = value


def _walk_props(node: Any):
    if isinstance(node, list):
        for child in node:
            yield from _walk_props(child)
    elif isinstance(node, dict):
        props = node.get("props")
        if isinstance(props, dict):
            yield props
            yield from _walk_props(props.get("children"))


def _number(text: str) -> float | None:
    return None if text == "None" else float(text)


def urllib_transport(base: str) -> tuple[Callable[[str], Any], Callable[[str, Any], Any]]:
    def get_json(path: str) -> Any:
        with urllib.request.urlopen(base + path, timeout=600) as response:
            return json.loads(response.read())

    def post_json(path: str, payload: Any) -> Any:
        request = urllib.request.Request(base + path, data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            body = response.read()
            return json.loads(body) if body else None

    return get_json, post_json


# -- measurements ---------------------------------------------------------------------------------------
def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95


def timed(action: Callable[[], Any]) -> float:
    start = time.perf_counter()
    action()
    return (time.perf_counter() - start) * 1000


def server_latencies(client: DashClient, repeats: int, rng: random.Random) -> dict[str, list[float]]:
    client.trigger(VIEW_OUTPUT)
    nodes = [n["id"] for n in client.graph()["nodes"]]
    steps = client.props[("step-slider", "max")] + 1
    trials = [o["value"] for o in client.props[("trial-select", "options")]]
    hover_cards = [timed(client.hover_cards)]  # as the page does once a step is shown
    actions: dict[str, Callable[[], Any]] = {
        "node click: values route (what the page draws)": lambda: client.click_values(rng.choice(nodes)),
        "node click: view callback (selectors, link)": lambda: client.trigger(
            VIEW_OUTPUT, {"node-click.data": {"id": rng.choice(nodes), "t": time.time()}}),
        "step slider": lambda: client.trigger(VIEW_OUTPUT, {"step-slider.value": rng.randrange(steps)}),
        "batch/sample": lambda: client.trigger(VIEW_OUTPUT, {"aggregation-select.value": rng.choice(
            [o["value"] for o in client.props[("aggregation-select", "options")]])}),
        "iteration": lambda: client.trigger(VIEW_OUTPUT, {"iteration-slider.value": rng.randrange(
            client.props[("iteration-slider", "max")] + 1)}),
        "trial": lambda: client.trigger(VIEW_OUTPUT, {"trial-select.value": rng.choice(trials)}),
    }
    results = {name: [timed(action) for _ in range(repeats)] for name, action in actions.items()}
    for _ in range(repeats - 1):
        client.trigger(VIEW_OUTPUT, {"step-slider.value": rng.randrange(steps)})
        hover_cards.append(timed(client.hover_cards))
    results["hover cards after a step change (reads the whole step)"] = hover_cards
    results["next step: values route, as the page asks it (a user's pause between clicks)"] = next_steps(
        client, repeats)
    results["node click: values route answer (KiB, not ms)"] = [
        len(json.dumps(client.click_values(rng.choice(nodes)))) / 1024 for _ in range(repeats)]
    results["node click: view callback answer (KiB, not ms)"] = [len(json.dumps(actions[
        "node click: view callback (selectors, link)"]())) / 1024 for _ in range(repeats)]
    results["series plot, a new tensor"] = [_series_after(client, rng, {"node-click.data": {
        "id": rng.choice(nodes), "t": time.time()}}, rng.choice(STATISTICS)) for _ in range(repeats)]
    results["series plot, same tensor at another step"] = [_series_after(client, rng, {
        "step-slider.value": rng.randrange(steps)}, "mean") for _ in range(repeats)]
    return results


STATISTICS = ("mean", "abs_mean", "std", "min", "max", "abs_max")


def next_steps(client: DashClient, repeats: int) -> list[float]:
    """The values route's time for the next-step button, followed (untimed) by what the page asks next:
    the button's view callback and the hover cards; then a user's pause."""
    client.trigger(VIEW_OUTPUT, {"step-slider.value": 0})
    client.hover_cards()
    times = []
    for clicks in range(1, repeats + 1):
        time.sleep(PAUSE_MS / 1000)
        times.append(timed(lambda: client.step_values("step_next")))
        client.trigger(VIEW_OUTPUT, {"step-next.n_clicks": clicks})
        client.hover_cards()
    return times


def _series_after(client: DashClient, rng: random.Random, change: dict[str, Any], statistic: str) -> float:
    """Time the series plot's callback after ``change`` (untimed) changed the selection."""
    client.trigger(VIEW_OUTPUT, change)
    return timed(lambda: client.trigger("series-plot.children", {"shown.data": client.shown(),
                                                                 "statistic-select.value": statistic}))


def rss_by_steps_visited(client: DashClient, pid: int, checkpoints: list[int]) -> list[tuple[int, float]]:
    import psutil

    process = psutil.Process(pid)
    client.trigger(VIEW_OUTPUT)
    total = client.props[("step-slider", "max")] + 1
    result, visited = [(0, process.memory_info().rss / 2**20)], 0
    for checkpoint in checkpoints:
        target = min(checkpoint, total)
        while visited < target:
            index = round(visited * (total - 1) / max(1, target - 1)) if target > 1 else 0
            client.trigger(VIEW_OUTPUT, {"step-slider.value": index})
            visited += 1
        result.append((visited, process.memory_info().rss / 2**20))
        if target == total:
            break
    return result


# Timing inside the page: from navigation start, or from the click event, until #values changed.
PAGE_TIMER = """
window.__comgra = {start: 0, end: 0, loaded: 0};
document.addEventListener('click', () => { window.__comgra.start = performance.now(); window.__comgra.end = 0; }, true);
new MutationObserver((mutations) => {
  const values = document.getElementById('values');
  if (!values) return;
  if (!window.__comgra.loaded && document.getElementById('stat-mean')) window.__comgra.loaded = performance.now();
  const changed = mutations.some(m => values.contains(m.target));
  if (changed && window.__comgra.start && !window.__comgra.end) window.__comgra.end = performance.now();
}).observe(document, {childList: true, subtree: true, characterData: true});
performance.setResourceTimingBufferSize(100000);
window.__comgra.longTasks = [];
try {
  new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__comgra.longTasks.push([e.startTime, e.duration]); })
    .observe({type: 'longtask', buffered: true});
} catch (e) {}
"""
# Where a click's time went, from the page's Resource Timing of the values route and its long tasks.
CLICK_PHASES = """
() => {
  const c = window.__comgra;
  const asks = performance.getEntriesByType('resource').filter(e => e.name.includes('_comgra/values') && e.startTime >= c.start);
  const busy = c.longTasks.filter(([s, d]) => s < c.end && s + d > c.start).reduce((t, [s, d]) => t + Math.min(s + d, c.end) - Math.max(s, c.start), 0);
  if (!asks.length) return {"main thread busy in long tasks": busy};
  const e = asks[0];
  return {"click until the values request started": e.startTime - c.start,
          "request queued (no free connection)": e.requestStart - e.startTime,
          "request until the answer's first byte (server + network)": e.responseStart - e.requestStart,
          "answer downloaded": e.responseEnd - e.responseStart,
          "answer until the values changed": c.end - e.responseEnd,
          "main thread busy in long tasks": busy};
}
"""
PAUSE_MS = 500  # a user looks at the numbers before the next click; the plots finish meanwhile


def browser_latencies(url: str, repeats: int, series_off_too: bool = False,
                      draw_all_too: bool = False) -> dict[str, list[float]]:
    """Page load, node clicks and next-step clicks, timed in the page at 1280x800.

    With ``series_off_too`` the clicks are timed in three passes on fresh pages, side by side: with
    the series plot, with the series plot's callback answered "no update" by the browser itself (so
    the server never reads a series), and with the series plot again; every pass routes the page's
    callbacks through the same interception, so that they differ only in the series read. With
    ``draw_all_too`` likewise: drawn as by default, with the whole graph drawn, and as by default again."""
    from playwright.sync_api import sync_playwright

    results: dict[str, list[float]] = {"page load": [], "node click": [], "next step": []}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for _ in range(max(3, repeats // 5)):
            page = browser.new_page()
            page.add_init_script(PAGE_TIMER)
            page.goto(url)
            page.wait_for_selector("#series-plot .js-plotly-plot", timeout=120_000)  # idle before the next load
            results["page load"].append(page.evaluate("window.__comgra.loaded"))
            page.close()
        if series_off_too:
            passes = [("", True, False), (" (series plot off)", False, False), (" (series plot on, again)", True, False)]
        elif draw_all_too:
            passes = [("", None, False), (" (whole graph drawn)", None, True), (" (in view only, again)", None, False)]
        else:
            passes = [("", None, False)]
        for seed, (label, series_on, draw_all) in enumerate(passes):  # other nodes in each pass: the service
            results.setdefault(f"node click{label}", [])                # keeps the series it read
            results.setdefault(f"next step{label}", [])
            _click_pass(browser, url, repeats, results, label, series_on, seed=seed, draw_all=draw_all)
        browser.close()
    return results


SERIES_OUTPUT = "series-plot.children"  # comgra.server.tensors: the series plot's Dash output


def _click_pass(browser: Any, url: str, repeats: int, results: dict[str, list[float]], label: str,
                series_on: bool | None, seed: int, draw_all: bool = False) -> None:
    """``repeats`` node clicks and next-step clicks on a fresh page; ``series_on`` False: the series
    plot's callback requests are answered 204 (Dash's "no update") in the browser, True: sent on through
    the same interception, None: no interception; ``draw_all``: the whole graph drawn, not only the view."""
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.add_init_script(PAGE_TIMER)
    if draw_all:
        page.add_init_script("window.COMGRA_DRAW_ALL = true;")
    if series_on is not None:
        def route(request_route: Any) -> None:
            body = request_route.request.post_data_json or {}
            if not series_on and body.get("output") == SERIES_OUTPUT and body.get("changedPropIds"):
                request_route.fulfill(status=204, body="")
            else:
                request_route.continue_()
        page.route("**/_dash-update-component", route)
    page.goto(url)
    page.wait_for_selector("#series-plot .js-plotly-plot")
    page.wait_for_timeout(4000)  # the previous pass's last series read has ended
    nodes = page.evaluate(SHOWN_NODES)  # drawn or not: the graph draws only what is in view
    random.Random(0).shuffle(nodes)  # near and far nodes, in boxes and not
    # every click changes the selection; "input" last, where the graph has one
    nodes = [n for n in nodes if n != "input"] + (["input"] if "input" in nodes else [])
    nodes = nodes[seed * repeats:] + nodes[:seed * repeats]
    for i in range(repeats):
        node = nodes[i % len(nodes)]
        cpu = ChromiumCpu()
        results[f"node click{label}"].append(_click_until_values_change(
            page, f'#dependency-graph [data-node="{node}"]', reveal=node, cpu=cpu))
        results.setdefault(f"node click{label} · {CPU_ROW}", []).append(cpu.ms)
        for phase, ms in page.evaluate(CLICK_PHASES).items():
            results.setdefault(f"node click{label} · {phase}", []).append(ms)
        results[f"next step{label}"].append(_click_until_values_change(page, "#step-next", cpu=cpu))
        results.setdefault(f"next step{label} · {CPU_ROW}", []).append(cpu.ms)
    page.close()


# The nodes a user can click (those in closed boxes are not shown), in the order of the graph document.
SHOWN_NODES = """() => { const s = window.comgraGraph.state;
  return s.doc.nodes.map(n => n.id).filter(id => s.layout.nodes[id] && !s.layout.nodes[id].hidden); }"""


REVEAL = """async id => {
  if (window.comgraGraph.reveal) window.comgraGraph.reveal(id);
  else { const e = document.querySelector(`#dependency-graph [data-node="${id}"]`); if (e) e.scrollIntoView({block: 'nearest', inline: 'center'}); }
  for (let i = 0; i < 2; i++) await new Promise(done => requestAnimationFrame(done));
}"""
REVEAL_MS = 100  # from the scroll that brings a node into view until the click on it (the mouse moves)


CPU_ROW = "CPU time of all Chromium processes, click until the values changed (less sensitive to load)"


class ChromiumCpu:
    """CPU milliseconds (user + system) that this script's Chromium processes spent between ``start()`` and
    ``stop()``: on a shared machine a click's wall time mostly measures the other users, its CPU time less so."""

    def __init__(self) -> None:
        self.ms = float("nan")
        self._before = 0.0

    @staticmethod
    def _total() -> float:
        import psutil

        total = 0.0
        for child in psutil.Process().children(recursive=True):
            try:
                if "chrom" in child.name().lower():
                    times = child.cpu_times()
                    total += times.user + times.system
            except psutil.Error:
                pass
        return total * 1000

    def start(self) -> None:
        self._before = self._total()

    def stop(self) -> None:
        self.ms = self._total() - self._before


def _click_until_values_change(page: Any, selector: str, reveal: str | None = None,
                               cpu: ChromiumCpu | None = None) -> float:
    """Milliseconds, measured in the page, from the click event until the values panel changed. ``reveal``:
    a node scrolled into view (and drawn) after the pause and before the click, untimed, as a user scrolls
    to it first. ``cpu``: Chromium's CPU time from just before the click until the values changed."""
    page.wait_for_timeout(PAUSE_MS)
    if reveal is not None:
        page.evaluate(REVEAL, reveal)
        page.wait_for_timeout(REVEAL_MS)
    if cpu is not None:
        cpu.start()
    page.click(selector)
    page.wait_for_function("window.__comgra.end > 0", timeout=10_000, polling="raf")
    if cpu is not None:
        cpu.stop()
    return page.evaluate("window.__comgra.end - window.__comgra.start")


# -- the run ---------------------------------------------------------------------------------------------
def recording_for(scale: float, out: Path, nodes: int = 15) -> Path:
    import synthetic_recording

    root = out / (f"scale-{scale:g}" if nodes == 15 else f"nodes-{nodes}-scale-{scale:g}")
    group = root / "synthetic"
    if not (root / "complete").exists():
        start = time.perf_counter()
        # Larger graphs and longer runs repeat the values of their first steps, so that they are written in
        # minutes; the app reads each step's rows all the same.
        distinct = 10**9 if nodes <= 15 and scale <= 1 else 8
        options = synthetic_recording.Options(scale=scale, nodes=nodes, distinct_steps=distinct, jobs=2, progress=True)
        synthetic_recording.write_recording(root, options)
        (root / "complete").write_text("")
        print(f"# wrote {nodes} nodes, scale {scale:g} in {time.perf_counter() - start:.0f} s", flush=True)
    return group


def start_server(group: Path, source: Path | None = None,
                 findings_scan: bool = False) -> tuple[subprocess.Popen, str, float]:
    """``comgra --path group`` in a subprocess; with ``source``, comgra imported from that src folder.
    Without ``findings_scan``, the server scans nothing in the background (``--no-findings-scan``)."""
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(source)} if source else None
    options = [] if findings_scan else ["--no-findings-scan"]
    process = subprocess.Popen([sys.executable, "-m", "comgra.cli.app", "--path", str(group), "--port", "0", *options],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in process.stdout:
        match = re.search(r"(http://[^\s?]+)", line)  # the address without ?token=: reads are open on loopback
        if match:
            url = match.group(1)
            break
    else:
        raise RuntimeError("the server did not start")
    urllib.request.urlopen(url, timeout=30).read()
    return process, url, time.perf_counter() - start


# The figures of the README's app-latency table: (row label in the full table, column of the summary).
SUMMARY = [("browser: node click", "browser: node click until values changed"),
           ("server: node click: values route (what the page draws)", "server: values route"),
           ("browser: next step", "browser: next step"),
           ("server: next step: values route, as the page asks it (a user's pause between clicks)",
            "server: next step, values route"),
           ("server: hover cards after a step change (reads the whole step)",
            "server: hover cards after a jump to another step")]


def measure(scale: float, args: argparse.Namespace, nodes: int = 15, source: Path | None = None,
            label: str = "") -> tuple[list[str], dict[str, str]]:
    """The full table's rows of one recording, and the summary's figures ("p50 / p95") by column."""
    group = recording_for(scale, args.out, nodes)
    # A baseline comgra from before --no-findings-scan scans in the background: it is waited for below.
    scan_runs = args.findings_scan or not _knows_no_scan_option(source)
    process, url, startup = start_server(group, source, findings_scan=scan_runs)
    try:
        client = DashClient(*urllib_transport(url.rstrip("/")))
        client.trigger(VIEW_OUTPUT)
        size = len(client.graph()["nodes"])
        head = f"| {size} | {scale:g}{label} |"
        summary = {"nodes": f"{size:,}", "scale": f"{scale:g}x{label}"}
        rows = [f"{head} start until the page is served | {startup * 1000:.0f} | |"]
        if scan_runs:  # the page starts a findings scan in the server; clicks are timed once it is done
            scan = timed(lambda: urllib.request.urlopen(url.rstrip("/") + "/api/v1/findings", timeout=3600).read())
            rows.append(f"{head} findings scan of every trial, waited for before timing (s, not ms) | "
                        f"{scan / 1000:.1f} | |")
        if args.no_server:  # as the server timings leave it: the first series read (footers) is done
            client.trigger(SERIES_OUTPUT, {"shown.data": client.shown()})
        for name, samples in ({} if args.no_server else server_latencies(client, args.repeats, random.Random(0))).items():
            p50, p95 = percentiles(samples)
            rows.append(f"{head} server: {name} | {p50:.1f} | {p95:.1f} |")
            summary[f"server: {name}"] = f"{p50:.1f} / {p95:.1f}"
        if not args.no_browser:
            for name, samples in browser_latencies(url, args.repeats, args.series_off_too, args.draw_all_too).items():
                p50, p95 = percentiles(samples)
                rows.append(f"{head} browser: {name} | {p50:.0f} | {p95:.0f} |")
                summary[f"browser: {name}"] = f"{p50:.0f} / {p95:.0f}"
        if not args.no_rss:
            for visited, rss in rss_by_steps_visited(client, process.pid, [100, 300, 1000]):
                rows.append(f"{head} server RSS after visiting {visited} steps (MiB) | {rss:.0f} | |")
    finally:
        process.terminate()
        process.wait(10)
    return rows, summary


def _knows_no_scan_option(source: Path | None) -> bool:
    """Whether the comgra in ``source`` (None: this tree's) has ``comgra --no-findings-scan``."""
    if source is None:
        return True
    cli = source / "comgra" / "cli" / "app.py"
    return cli.exists() and "--no-findings-scan" in cli.read_text()


def summary_table(summaries: list[dict[str, str]]) -> list[str]:
    """The README's table: per recording, the click targets' figures (p50 / p95 ms)."""
    lines = ["| nodes | scale | " + " | ".join(column for _, column in SUMMARY) + " |",
             "|---|---|" + "---|" * len(SUMMARY)]
    for summary in summaries:
        figures = [summary.get(key, "–") for key, _ in SUMMARY]
        lines.append(f"| {summary['nodes']} | {summary['scale']} | " + " | ".join(figures) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, action="append", help="repeatable; default: 1 and 50")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, default=HERE / "out")
    parser.add_argument("--nodes", type=int, action="append",
                        help="graph size, repeatable; 15 (default): the tutorial's network, more: a transformer")
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--no-rss", action="store_true", help="skip the memory walk over the steps")
    parser.add_argument("--no-server", action="store_true", help="skip the server-side timings")
    parser.add_argument("--series-off-too", action="store_true",
                        help="time the browser's clicks also with the series plot switched off, side by side")
    parser.add_argument("--draw-all-too", action="store_true",
                        help="time the browser's clicks also with the whole graph drawn (as before the graph drew "
                             "only what is in view), side by side")
    parser.add_argument("--findings-scan", action="store_true",
                        help="let the server scan for findings (its default) and time the clicks after the scans")
    parser.add_argument("--baseline-src", type=Path,
                        help="a src folder of another comgra (e.g. `git archive HEAD src`): each recording is "
                             "measured with its server too, right before this tree's, marked 'baseline'")
    args = parser.parse_args(argv)
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, uptime: "
          f"{subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}", flush=True)
    print("| nodes | scale | measurement | p50 ms | p95 ms |\n|---|---|---|---|---|", flush=True)
    summaries = []
    for nodes in args.nodes or [15]:
        for scale in args.scale or [1.0, 50.0]:
            runs = [(args.baseline_src, " baseline"), (None, "")] if args.baseline_src else [(None, "")]
            for source, label in runs:
                rows, summary = measure(scale, args, nodes, source, label)
                summaries.append(summary)
                for row in rows:
                    print(row, flush=True)
    print(f"\n# Summary for the README (p50 / p95 ms), ended {time.strftime('%H:%M:%S', time.gmtime())} UTC, uptime: "
          f"{subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    for line in summary_table(summaries):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

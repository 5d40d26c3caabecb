"""The Profile tab (flame graph, slowest layers, Chrome trace download) and the Resources tab.

A callback reads the tab and trial, asks the service (``flame_graph``, ``profile_summary``,
``resources``), and builds components with the pure functions below. Each view links to the
API call that returns its data.
"""
from __future__ import annotations

import datetime as dt
import zlib
from typing import Any

import plotly.graph_objects as go
from dash import Dash, Input, Output, dcc, html, no_update
from dash.development.base_component import Component

from comgra.errors import ComgraError
from comgra.server.api import api_url
from comgra.server.dom import attributes
from comgra.service import RecordingService

SLOWEST = 20  # rows of the slowest-layers table


class ID:
    PHASE = "profile-phase"
    EXECUTION = "profile-execution"
    EXECUTION_BOX = "profile-execution-box"
    FIRST_STEP = "profile-first-step"
    LAST_STEP = "profile-last-step"
    FLAME = "profile-flame"
    TABLE = "profile-table"
    LINKS = "profile-links"
    RESOURCES = "resources-plots"
    RESOURCES_STATUS = "resources-status"
    RESOURCES_LINKS = "resources-links"


def api_link(href: str, text: str = "API") -> html.A:
    """The small link beside a view to the API call that returns its data."""
    return html.A(text, href=href, target="_blank", className="api-link small", title=f"This view's data: {href}",
                  **attributes({"data-api": href}))


# -- skeletons ---------------------------------------------------------------------------------------
def profile_panel() -> html.Div:
    return html.Div(className="profile-panel", children=[
        html.Div(className="d-flex flex-wrap align-items-end gap-3 mb-2", children=[
            html.Div(className="selector", children=[
                html.Label("Time", htmlFor=ID.PHASE, className="form-label"),
                dcc.RadioItems(id=ID.PHASE, value="forward", inline=True, className="phase-radio",
                               options=[{"label": " forward ", "value": "forward"},
                                        {"label": " backward ", "value": "backward"}])]),
            html.Div(className="selector", children=[
                html.Label("Training steps", htmlFor=ID.FIRST_STEP, className="form-label"),
                html.Div(className="d-flex align-items-center gap-1", children=[
                    dcc.Input(id=ID.FIRST_STEP, type="number", min=0, step=1, placeholder="first", debounce=True,
                              className="form-control form-control-sm step-bound"),
                    html.Span("–"),
                    dcc.Input(id=ID.LAST_STEP, type="number", min=0, step=1, placeholder="last", debounce=True,
                              className="form-control form-control-sm step-bound")])]),
            html.Div(id=ID.EXECUTION_BOX, className="selector", style={"display": "none"}, children=[
                html.Label("Execution", htmlFor=ID.EXECUTION, className="form-label"),
                dcc.RadioItems(id=ID.EXECUTION, inline=True, className="execution-radio", options=[])]),
            html.Div(id=ID.LINKS, className="profile-links d-flex gap-3"),
        ]),
        html.Div(id=ID.FLAME, className="profile-flame"),
        html.H2("Slowest layers", className="h6 mt-3"),
        html.Div(id=ID.TABLE, className="profile-table"),
    ])


def resources_panel() -> html.Div:
    return html.Div(className="resources-panel", children=[
        html.Div(className="d-flex flex-wrap gap-3 mb-2", children=[
            html.P(id=ID.RESOURCES_STATUS, className="resources-status mb-0", role="status"),
            html.Div(id=ID.RESOURCES_LINKS)]),
        html.Div(id=ID.RESOURCES, className="resources-plots"),
    ])


# -- pure builders ---------------------------------------------------------------------------------
FLAME_COLOURS = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
                 "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f")  # ColorBrewer Set3: light, so that labels read in black


ALL_MODULES = "all tracked modules"  # the flame graph's root band where several modules were tracked side by side


def module_colour(name: str) -> str:
    """The same colour for a module in every phase, trial and process (a hash of its name, not its position)."""
    return FLAME_COLOURS[zlib.crc32(name.encode()) % len(FLAME_COLOURS)]


def flame_label(name: str) -> str:
    """The last part of a module's name, with its parents' up to one that is not a number: "layers.0", not "0"."""
    parts = name.split(".")
    keep = 1
    while keep < len(parts) and parts[-keep].isdigit():
        keep += 1
    return ".".join(parts[-keep:])


def flame_figure(nodes: list[dict[str, Any]], phase: str) -> go.Figure:
    """An icicle (a flame graph drawn top-down): a parent's bar spans its children's.

    Each bar is coloured by its module's name. Modules tracked side by side (several roots) get a band of
    their own above them, named: plotly would draw a blank one."""
    roots = [n for n in nodes if not n["parent"]]
    if len(roots) > 1:
        nodes = [{"name": ALL_MODULES, "parent": "", "value": sum(n["value"] for n in roots), "self_value": 0.0,
                  "calls": sum(n["calls"] for n in roots)}] + \
                [{**n, "parent": n["parent"] or ALL_MODULES} for n in nodes]
    colours = [module_colour(n["name"]) if n["name"] != ALL_MODULES else "#e9ecef" for n in nodes]
    figure = go.Figure(go.Icicle(
        ids=[n["name"] for n in nodes], labels=[flame_label(n["name"]) for n in nodes],
        parents=[n["parent"] for n in nodes], values=[n["value"] for n in nodes], branchvalues="total",
        tiling={"orientation": "v"}, marker={"colors": colours}, textfont={"color": "#212529"},
        customdata=[[n["self_value"] * 1e3, n["calls"]] for n in nodes],
        hovertemplate="<b>%{id}</b><br>%{value:.4f} s in total<br>%{customdata[0]:.3f} ms self"
                      "<br>%{customdata[1]} calls<extra></extra>"))
    figure.update_layout(margin={"t": 30, "l": 0, "r": 0, "b": 0}, height=420,
                         title={"text": f"{phase} time by module (s)", "font": {"size": 13}})
    return figure


def slowest_table(rows: list[dict[str, Any]]) -> html.Table:
    header = html.Tr([html.Th(h) for h in ("Module", "Total (s)", "Calls", "Mean (ms)", "Min (ms)", "Max (ms)")])
    body = [html.Tr([html.Td(r["module"], className="module"), html.Td(f"{r['total']:.4f}"), html.Td(r["calls"]),
                     html.Td(f"{r['mean'] * 1e3:.3f}"), html.Td(f"{r['min'] * 1e3:.3f}"),
                     html.Td(f"{r['max'] * 1e3:.3f}")], **attributes({"data-module": r["module"]})) for r in rows]
    return html.Table([html.Thead(header), html.Tbody(body)], className="table table-sm slowest-layers")


TIME_TICKS = [  # clock times on one line (plotly's own puts the date on a second line, which the margin cut)
    {"dtickrange": [None, 1000], "value": "%H:%M:%S.%L"}, {"dtickrange": [1000, 86_400_000], "value": "%H:%M:%S"},
    {"dtickrange": [86_400_000, None], "value": "%b %d, %H:%M"}]
BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def binary_unit(largest: float) -> tuple[str, float]:
    """The binary unit (B, KiB, MiB, ...) in which ``largest`` bytes reads as a number below 1024, and its size."""
    power = 0
    while power < len(BINARY_UNITS) - 1 and abs(largest) >= 1024 ** (power + 1):
        power += 1
    return BINARY_UNITS[power], float(1024 ** power)


def percent_title(members: list[dict[str, Any]]) -> str:
    """Names only what was sampled: "GPU" only where a GPU's utilisation was recorded."""
    parts = [name for name, present in (
        ("CPU", any(s["metric"] == "cpu_percent" for s in members)),
        ("GPU", any(str(s["source"]).startswith("gpu") for s in members)),
        ("memory", any(s["metric"] == "memory_percent" for s in members))) if present]
    named = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else "".join(parts) or "Use"
    return f"{named[:1].upper()}{named[1:]} use (%)"


# Plain words for the stored (source, metric) names of resource samples; the store keeps its names.
SOURCES = {"process": "Training process", "machine": "Whole machine"}
METRICS = {"cpu_percent": "CPU", "memory_bytes": "memory in use", "memory_percent": "memory in use",
           "utilization_percent": "utilisation", "memory_used_bytes": "memory in use"}


def series_label(source: str, metric: str, rank: Any = 0) -> str:
    """``process memory_bytes`` as a legend says it: "Training process: memory in use"."""
    where = SOURCES.get(source) or (f"GPU {source.split(':', 1)[1]}" if source.startswith("gpu:") else source)
    what = METRICS.get(metric) or metric.removesuffix("_percent").removesuffix("_bytes").replace("_", " ")
    return f"{where}: {what}" + (f" (rank {rank})" if rank else "")


def gpu_sentence(status: str) -> str:
    """The recorder's GPU status (NVML's exception text where there was no GPU) as a sentence for a person."""
    if not status.startswith("no GPU"):
        return f"GPU: {status}"
    if "nvidia-ml-py is not installed" in status:
        why = "the package nvidia-ml-py, which reads NVIDIA GPUs, is not installed (pip install nvidia-ml-py)"
    elif "LibraryNotFound" in status or "NVML is not available" in status:
        why = "no NVIDIA driver was found on the machine that trained"
    elif "no devices" in status:
        why = "the NVIDIA driver saw no GPU"
    else:
        why = status.removeprefix("no GPU").lstrip(": ")
    return f"No GPU was sampled: {why}. CPU and memory were."


def resource_figures(series: list[dict[str, Any]]) -> list[tuple[str, go.Figure]]:
    """One figure per kind of quantity (percent, bytes), one line per source and metric.

    Bytes read in binary units (KiB, MiB, GiB: plotly's own "8B" would mean 8 billion), the unit chosen by the
    largest value; times as UTC clock times on one line, which the margin makes room for."""
    groups = {"percent": [s for s in series if s["metric"].endswith("percent")],
              "bytes": [s for s in series if s["metric"].endswith("bytes") and "total" not in s["metric"]]}
    figures = []
    for kind, members in groups.items():
        if not members:
            continue
        unit, size = "%", 1.0
        if kind == "bytes":
            unit, size = binary_unit(max((abs(v) for s in members for v in s["value"] if v is not None), default=0.0))
        figure = go.Figure([go.Scatter(x=[dt.datetime.fromtimestamp(t, dt.timezone.utc) for t in s["wall_time"]],
                                       y=[None if v is None else v / size for v in s["value"]], mode="lines+markers",
                                       name=series_label(s["source"], s["metric"], s["rank"]),
                                       customdata=s["training_step"],
                                       hovertemplate=f"%{{y:.4~f}} {unit}<br>%{{x|%H:%M:%S.%L}} UTC<br>training step "
                                                     "%{customdata}<extra>%{fullData.name}</extra>")
                            for s in members])
        title = percent_title(members) if kind == "percent" else f"Memory ({unit})"
        figure.update_layout(title={"text": title, "font": {"size": 13}}, height=320,
                             margin={"t": 40, "l": 60, "r": 50, "b": 40}, legend={"orientation": "h", "y": -0.3},
                             xaxis={"tickformatstops": TIME_TICKS, "automargin": True, "title": {"text": "time (UTC)"}},
                             yaxis={"exponentformat": "none", "automargin": True,
                                    "ticksuffix": "" if kind == "percent" else f" {unit}"})
        figures.append((kind, figure))
    return figures


def step_bound(value: Any) -> int | None:
    """A step range's bound as typed: a whole number from 0, or None (no bound)."""
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 \
        and float(value).is_integer() else None


def profile_view(service: RecordingService, trial: str, phase: str, first_step: int | None = None,
                 last_step: int | None = None, execution: str | None = None) -> dict[str, Any]:
    """The views of the steps from ``first_step`` to ``last_step`` (both included; None: no bound) of type
    ``execution`` (None: every type)."""
    steps: dict[str, Any] = {"first_step": first_step, "last_step": last_step, "execution": execution}
    nodes = service.flame_graph(trial, phase, **steps)
    suffix = "" if first_step is None and last_step is None else \
        f"-steps-{'' if first_step is None else first_step}-{'' if last_step is None else last_step}"
    links = [api_link(api_url(f"trials/{trial}/flamegraph", phase=phase, **steps), "Flame graph (API)"),
             api_link(api_url(f"trials/{trial}/profile", phase=phase, **steps), "Slowest layers (API)"),
             html.A("Download Chrome trace", href=api_url(f"trials/{trial}/trace", download=1, **steps),
                    download=f"comgra-trace-{trial}{suffix}.json", className="trace-download small",
                    title="The training steps chosen at the left; opens in https://ui.perfetto.dev and chrome://tracing")]
    if not nodes:
        where = "" if not suffix else " in these training steps"
        message = html.P(f"Nothing to show: trial {trial!r} recorded no per-layer {phase} times{where}. This tab "
                         "shows how long each module takes; it fills in when a module is tracked with profile=True: "
                         "recorder.track_module(name, module, profile=True).",
                         className="text-muted no-profile")
        return {"flame": message, "table": None, "links": links[:2]}
    rows = service.profile_summary(trial, phase, limit=SLOWEST, **steps)
    return {"flame": dcc.Graph(figure=flame_figure(nodes, phase), config={"displaylogo": False}),
            "table": slowest_table(rows), "links": links}


def resources_view(service: RecordingService, trial: str) -> dict[str, Any]:
    answer = service.resources(trial)
    plots: list[Component] = [html.Div(dcc.Graph(figure=f, config={"displaylogo": False}), className="resource-plot",
                                       **attributes({"data-kind": kind}))
                              for kind, f in resource_figures(answer["series"])]
    if not plots:
        plots = [html.P(f"No resource samples in trial {trial!r} (recorded with resource_seconds=None?).",
                        className="text-muted")]
    return {"status": html.Span(gpu_sentence(answer["gpu"]), title=answer["gpu"]), "plots": plots,
            "links": api_link(api_url(f"trials/{trial}/resources"), "Resources (API)")}


PANELS = {"profile": profile_panel, "resources": resources_panel}  # tab -> skeleton, for layout.page


# -- callbacks -------------------------------------------------------------------------------------
def register(app: Dash, service: RecordingService, *, tabs: str, current_trial: str, data_version: str) -> None:
    @app.callback(Output(ID.FLAME, "children"), Output(ID.TABLE, "children"), Output(ID.LINKS, "children"),
                  Output(ID.EXECUTION, "options"), Output(ID.EXECUTION, "value"), Output(ID.EXECUTION_BOX, "style"),
                  Input(tabs, "active_tab"), Input(current_trial, "data"), Input(ID.PHASE, "value"),
                  Input(data_version, "data"), Input(ID.FIRST_STEP, "value"), Input(ID.LAST_STEP, "value"),
                  Input(ID.EXECUTION, "value"))
    def update_profile(active: str, trial: Any, phase: Any, _version: Any, first: Any, last: Any,
                       execution: Any) -> Any:
        if active != "profile":
            return (no_update,) * 6
        trial = _trial(service, trial)
        if trial is None:
            return html.P("This recording has no trials yet."), None, None, [], None, {"display": "none"}
        phase = phase if phase in ("forward", "backward") else "forward"
        try:
            # Where evaluations share training steps' numbers, one type at a time (the most profiled first):
            # a flame graph or a step's time over both would add up two different executions.
            types = service.layer_types(trial)
            chosen = execution if execution in types else (types[0] if types else None)
            selector = ([{"label": f" {kind} ", "value": kind} for kind in types], chosen,
                        {} if len(types) > 1 else {"display": "none"})
            view = profile_view(service, trial, phase, step_bound(first), step_bound(last),
                                chosen if len(types) > 1 else None)
        except ComgraError as error:
            return html.P(str(error), className="text-danger"), None, None, [], None, {"display": "none"}
        return view["flame"], view["table"], view["links"], *selector

    @app.callback(Output(ID.RESOURCES, "children"), Output(ID.RESOURCES_STATUS, "children"),
                  Output(ID.RESOURCES_LINKS, "children"),
                  Input(tabs, "active_tab"), Input(current_trial, "data"), Input(data_version, "data"))
    def update_resources(active: str, trial: Any, _version: Any) -> Any:
        if active != "resources":
            return no_update, no_update, no_update
        trial = _trial(service, trial)
        if trial is None:
            return None, "This recording has no trials yet.", None
        try:
            view = resources_view(service, trial)
        except ComgraError as error:
            return None, str(error), None
        return view["plots"], view["status"], view["links"]


def _trial(service: RecordingService, trial: Any) -> str | None:
    return (trial if isinstance(trial, str) else None) or next(iter(service.trials()), None)

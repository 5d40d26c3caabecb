"""The training's health at a glance, as plain data: the gradient norm of each layer over the recorded steps,
the sentinels' events, and the findings by node (the app's Health tab and the REST API).

Each item carries the app link (``view_link``) that opens the selection showing it: a heatmap cell opens that
layer's first parameter's gradient at that step, an event the nearest recorded step of its tensor, a node's
findings its most important finding's selection.

    >>> health = RecordingService(path).training_health("trial")   # doctest: +SKIP
    >>> health.layers[:2], health.steps[:3]                         # doctest: +SKIP
"""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from typing import Any

from comgra.analysis.findings import SEVERITIES, Finding
from comgra.service.findings import finding_link
from comgra.service.selection import view_link
from comgra.store import format as fmt
from comgra.store.reader import TrialReader

MAX_EVENTS = 200  # the sentinel events listed (the first ones: the first is the one that matters)


@dataclass
class TrainingHealth:
    trial: str
    steps: list[int] = field(default_factory=list)  # recorded training steps with gradient fingerprints
    layers: list[str] = field(default_factory=list)  # modules with parameters, in the order of the module tree
    grad_norm: list[list[float | None]] = field(default_factory=list)  # [layer][step]: L2 norm of its gradients
    cell_links: list[list[str | None]] = field(default_factory=list)  # [layer][step]
    events: list[dict[str, Any]] = field(default_factory=list)  # training_step, name, event, recorded, link
    event_count: int = 0
    findings_by_node: list[dict[str, Any]] = field(default_factory=list)  # node, error, warning, info, top, link
    dead_units: list[dict[str, Any]] = field(default_factory=list)  # node, message, link (dead_units findings)
    pending: bool = False  # findings of this trial still being scanned

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["grad_norm"] = [[v if v is None or math.isfinite(v) else str(v) for v in row] for row in self.grad_norm]
        return document


def training_health(trial: TrialReader, findings: list[Finding], *, pending: bool = False) -> TrainingHealth:
    health = TrainingHealth(trial.trial_id, pending=pending)
    nodes, kinds = _parameter_nodes_and_kinds(trial)
    _gradient_norms(trial, health, nodes, kinds)
    _events(trial, health, nodes)
    _findings(health, findings)
    return health


def _parameter_nodes_and_kinds(trial: TrialReader) -> tuple[dict[str, str], dict[int, str]]:
    """Parameter name -> its node (from the graphs); recorded step -> its first gradient group."""
    steps = trial.steps(rank=0)
    nodes: dict[str, str] = {}
    for graph_hash in dict.fromkeys(steps["graph"].to_pylist()):
        try:
            graph = trial.graph(graph_hash)
        except Exception:  # noqa: BLE001 - a damaged graph: its parameters open by their own name
            continue
        for node in graph.get("nodes", []):
            if node.get("role") == "parameter":
                for role in node.get("roles", []):
                    nodes.setdefault(str(role), node["node"])
    kinds: dict[int, str] = {}
    for step, step_kinds in zip(steps["training_step"].to_pylist(), steps["kinds"].to_pylist()):
        gradient = [k for k in (step_kinds or []) if k != fmt.FORWARD]
        if gradient:
            kinds.setdefault(int(step), sorted(gradient)[0])
    return nodes, kinds


def _gradient_norms(trial: TrialReader, health: TrainingHealth, nodes: dict[str, str], kinds: dict[int, str]) -> None:
    rows = trial.evidence("runinfo", rank=0)
    if not rows.num_rows:
        return
    norms: dict[str, dict[int, float]] = {}  # layer -> step -> sum of squares
    first_parameter: dict[str, str] = {}
    for subject, name, field_name, step, number in zip(
            rows["subject"].to_pylist(), rows["name"].to_pylist(), rows["field"].to_pylist(),
            rows["training_step"].to_pylist(), rows["number"].to_pylist()):
        if subject != "parameter" or field_name != "grad_norm" or number is None:
            continue
        layer = name.rsplit(".", 1)[0]
        first_parameter.setdefault(layer, name)
        per_step = norms.setdefault(layer, {})
        per_step[int(step)] = per_step.get(int(step), 0.0) + float(number) ** 2
    health.steps = sorted({s for per_step in norms.values() for s in per_step})
    health.layers = list(norms)  # the order the recorder met the parameters: the module tree's
    for layer in health.layers:
        parameter = first_parameter[layer]
        health.grad_norm.append([math.sqrt(norms[layer][s]) if s in norms[layer] else None for s in health.steps])
        health.cell_links.append([view_link(trial.trial_id, training_step=s, iteration=None,
                                            node_id=nodes.get(parameter, parameter), role=parameter,
                                            kind=kinds.get(s)) if s in norms[layer] else None for s in health.steps])


def _events(trial: TrialReader, health: TrainingHealth, nodes: dict[str, str]) -> None:
    rows = trial.evidence("sentinels")
    if not rows.num_rows:
        return
    recorded = sorted({int(s) for s, r in zip(rows["training_step"].to_pylist(), rows["recorded"].to_pylist()) if r})
    for step, name, event, was_recorded, rank in zip(
            rows["training_step"].to_pylist(), rows["name"].to_pylist(), rows["event"].to_pylist(),
            rows["recorded"].to_pylist(), rows["rank"].to_pylist()):
        if event is None:
            continue
        health.event_count += 1
        if len(health.events) >= MAX_EVENTS:
            continue
        shown = _nearest_at_or_after(recorded, int(step))
        link = None if shown is None or name == "batch" else view_link(
            trial.trial_id, training_step=shown, node_id=nodes.get(name, name), kind=fmt.FORWARD,
            rank=int(rank) if rank else None)
        health.events.append({"training_step": int(step), "name": name, "event": event, "recorded": bool(was_recorded),
                              "rank": int(rank), "shown_step": shown, "link": link})


def _nearest_at_or_after(recorded: list[int], step: int) -> int | None:
    index = bisect_left(recorded, step)
    if index < len(recorded):
        return recorded[index]
    return recorded[-1] if recorded else None


def _findings(health: TrainingHealth, findings: list[Finding]) -> None:
    by_node: dict[str, dict[str, Any]] = {}
    for finding in findings:  # ranked: the first of a node is its most important
        if finding.trial != health.trial:
            continue
        entry = by_node.setdefault(finding.node, {"node": finding.node, **{s: 0 for s in SEVERITIES},
                                                  "top": finding.message, "link": finding_link(finding)})
        entry[finding.severity] = entry.get(finding.severity, 0) + 1
        if finding.detector == "dead_units":
            health.dead_units.append({"node": finding.node, "message": finding.message, "link": finding_link(finding)})
    health.findings_by_node = list(by_node.values())

"""Node search across iterations: the search box lists the nodes of the shown iteration (assets/comgra.js,
``searchOptions``) and, from here, those that exist only in another iteration of the shown step, e.g. a loss
registered at the last iteration. Choosing one of those opens that iteration with the node selected."""
from __future__ import annotations

import logging
from typing import Any

import pyarrow.compute as pc
from dash import Dash, Input, Output

from comgra.errors import ComgraError
from comgra.server.graph_view import ROLE_NAMES
from comgra.server.ids import ID
from comgra.service import RecordingService

log = logging.getLogger("comgra.server")
ELSEWHERE = "\x1e"  # a search value ELSEWHERE<iteration>ELSEWHERE<node id>: a node of another iteration
MAX_OPTIONS = 500  # nodes of other iterations listed at most (the search box filters them as the user types)


def register(app: Dash, service: RecordingService) -> None:
    @app.callback(Output(ID.SEARCH_ELSEWHERE, "data"), Input(ID.STEP_KEY, "data"))
    def update(key: Any) -> Any:
        try:
            return elsewhere_options(service, key)
        except ComgraError:
            return []
        except Exception:  # noqa: BLE001 - an extra of the search box: the shown iteration's nodes are still listed
            log.exception("comgra: the nodes of the other iterations could not be listed")
            return []


def elsewhere_options(service: RecordingService, key: Any) -> list[dict[str, str]]:
    """The search options of the nodes in other iterations of the shown step and not in the shown one, each at
    the iteration nearest the shown one."""
    if not isinstance(key, dict) or not isinstance(key.get("trial"), str):
        return []
    trial, step, shown = key["trial"], key.get("training_step"), key.get("iteration")
    rank = key.get("rank") if isinstance(key.get("rank"), int) else 0
    if not isinstance(step, int) or not isinstance(shown, int):
        return []
    table = service.step_index(trial, rank).table
    rows = table.filter(pc.equal(table["training_step"], step)).select(["iteration", "graph"]).to_pylist()
    graphs = {int(r["iteration"]): r["graph"] for r in rows}
    if len(graphs) < 2 or shown not in graphs:
        return []
    reader = service.trial(trial)
    names = {n["node"] for n in reader.graph(graphs[shown])["nodes"]}
    found: dict[str, dict[str, str]] = {}
    for iteration in sorted((i for i in graphs if i != shown), key=lambda i: (abs(i - shown), i)):
        for node in reader.graph(graphs[iteration])["nodes"]:
            name = node["node"]
            if name in names or name in found or int(node.get("iteration_offset") or 0) < 0:
                continue
            role = ROLE_NAMES.get(str(node.get("role")), str(node.get("role")))
            found[name] = {"label": f"{name} [{role}] · only in iteration {iteration}",
                           "value": f"{ELSEWHERE}{iteration}{ELSEWHERE}{node['id']}"}
            if len(found) >= MAX_OPTIONS:
                break
    return sorted(found.values(), key=lambda option: option["label"])


def parse(value: Any) -> tuple[int, str] | None:
    """(iteration, node id) of a search value of another iteration; None for a node of the shown one."""
    if not isinstance(value, str) or not value.startswith(ELSEWHERE):
        return None
    iteration, _, node_id = value[1:].partition(ELSEWHERE)
    try:
        return int(iteration), node_id
    except ValueError:
        return None

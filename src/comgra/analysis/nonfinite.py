"""Where a NaN or an infinity first appears, and the chain of nodes it spreads through.

Forward: the origin is the node, earliest in dependency order, that holds a non-finite value while
the nodes it reads do not. Gradients: the origin is the node where the backward pass first
produces one: its own gradient is non-finite, the gradients of the nodes that read it are not.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from comgra.analysis import graphs as graph_tools
from comgra.analysis.findings import Finding
from comgra.analysis.loading import TrialData
from comgra.store import format as fmt

MAX_SPREAD_FINDINGS = 10
Located = tuple[str, int]  # (node, data iteration)


def detect(data: TrialData, facts: graph_tools.GraphFacts) -> list[Finding]:
    stats = data.stats
    if not len(stats):
        return []
    bad = stats[(stats["nan_count"] > 0) | (stats["inf_count"] > 0)]
    findings: list[Finding] = []
    forward_first: int | None = None
    for kind in sorted(bad["kind"].unique(), key=lambda k: (k != fmt.FORWARD, k)):
        rows = bad[bad["kind"] == kind]
        first = int(rows["training_step"].min())
        if kind == fmt.FORWARD:
            forward_first = first
        findings.extend(_origin_and_spread(data, facts, rows, kind, first, forward_first))
    return findings


def _origin_and_spread(data: TrialData, facts: graph_tools.GraphFacts, rows: pd.DataFrame, kind: str,
                       first: int, forward_first: int | None) -> list[Finding]:
    at = rows[rows["training_step"] == first]
    located: set[Located] = set(zip(at["node"], at["iteration"].astype(int)))
    dependencies, documents, unreadable = _step_graph(data, first)
    forward = kind == fmt.FORWARD
    if unreadable:
        return [_origin_unknown(data, facts, rows, at, kind, first, located, unreadable)]
    if forward:
        candidates = [n for n in located if not (dependencies.get(n, set()) & located)]
    else:
        dependents: dict[Located, set[Located]] = {}
        for target, sources in dependencies.items():
            for source in sources:
                dependents.setdefault(source, set()).add(target)
        candidates = [n for n in located if not (dependents.get(n, set()) & located)]

    def order(n: Located) -> tuple[int, int, int, str]:
        # The name last: nodes at the same place are ordered the same way in every run (a set's order is not).
        return (*graph_tools.order_key(documents.get(n[0]), n[1]), n[0])

    ordered = sorted(located, key=order, reverse=not forward)
    origin = min(candidates or ordered, key=order) if forward else max(candidates or ordered, key=order)
    chain = [n for n in ordered if n != origin]
    explained = not forward and forward_first is not None and forward_first <= first
    # The gradient of an input or a target changes no weight (BCE's gradient w.r.t. a 0/1 target is
    # infinite wherever the output is exactly 0 or 1): worth knowing, not an error.
    harmless = not forward and all(facts.role.get(n) in ("input", "target") for n, _ in located)
    origin_rows = at[(at["node"] == origin[0]) & (at["iteration"] == origin[1])]
    steps = sorted(rows.loc[rows["node"] == origin[0], "training_step"].unique().tolist())
    view_iteration = _view_iteration(data, first, origin[1])
    evidence: dict[str, Any] = {
        "nan_count": float(origin_rows["nan_count"].max()), "inf_count": float(origin_rows["inf_count"].max()),
        "spread_to": [f"{n}@{i}" for n, i in chain], "steps_with_non_finite": int(rows["training_step"].nunique()),
        "origin_has_finite_inputs": bool(candidates),
    }
    what = "NaN" if evidence["nan_count"] > 0 else "infinite"
    spread = ", ".join(f"{n} (iteration {i})" for n, i in chain[:6]) or "no other node"
    if forward:
        message = (f"First {what} value in the forward pass at step {first}: it starts at {origin[0]} "
                   f"(iteration {origin[1]}), whose inputs are finite, and spreads to {spread}.")
    else:
        message = (f"First {what} gradient ({kind}) at step {first}: the backward pass produces it at "
                   f"{origin[0]} (iteration {origin[1]}), whose dependents' gradients are finite; it spreads to "
                   f"{spread}.")
        if explained:
            message += f" It follows from the non-finite forward values at step {forward_first}."
    row = _pick_row(origin_rows)
    statistic = "nan_count" if evidence["nan_count"] > 0 else "inf_count"
    findings = [Finding(
        detector="non_finite", severity="info" if harmless else "warning" if explained else "error",
        score=1.0 if candidates else 0.6,
        trial=data.trial, node=origin[0], role=row["role"], kind=kind, training_step=first, steps=steps,
        iteration=view_iteration, message=message, evidence=evidence, aggregation=_aggregation_of(row),
        statistic=statistic, origin=not explained, column=facts.column.get(origin[0], 0))]
    for node, iteration in chain[:MAX_SPREAD_FINDINGS]:
        spread_rows = at[(at["node"] == node) & (at["iteration"] == iteration)]
        spread_row = _pick_row(spread_rows)
        findings.append(Finding(
            detector="non_finite", severity="info" if harmless else "warning", score=0.5, trial=data.trial, node=node,
            role=spread_row["role"], kind=kind, training_step=first, steps=[first],
            iteration=_view_iteration(data, first, iteration),
            message=f"Non-finite {'values' if forward else 'gradients'} at step {first} spread here from "
                    f"{origin[0]} (iteration {origin[1]}).",
            evidence={"origin": f"{origin[0]}@{origin[1]}", "nan_count": float(spread_rows["nan_count"].max()),
                      "inf_count": float(spread_rows["inf_count"].max())},
            aggregation=_aggregation_of(spread_row), statistic=statistic, origin=False,
            column=facts.column.get(node, 0)))
    return findings


def _origin_unknown(data: TrialData, facts: graph_tools.GraphFacts, rows: pd.DataFrame, at: pd.DataFrame, kind: str,
                    first: int, located: set[Located], unreadable: list[str]) -> Finding:
    """Where a problem starts is read from the step's graph: without it, say where it shows and that the origin is
    not known, rather than guess one."""
    nodes = sorted(located, key=lambda n: (n[1], n[0]))
    node, iteration = nodes[0]
    node_rows = at[(at["node"] == node) & (at["iteration"] == iteration)]
    row = _pick_row(node_rows)
    nan_count, inf_count = float(at["nan_count"].max()), float(at["inf_count"].max())
    listed = ", ".join(f"{n} (iteration {i})" for n, i in nodes[:6]) + (", ..." if len(nodes) > 6 else "")
    what = "NaN" if nan_count > 0 else "infinite"
    where = "in the forward pass" if kind == fmt.FORWARD else f"gradient ({kind})"
    graphs = ", ".join(f"graphs/{h}.json" for h in unreadable)
    return Finding(
        detector="non_finite", severity="error" if kind == fmt.FORWARD else "warning", score=0.5, trial=data.trial,
        node=node, role=row["role"], kind=kind, training_step=first,
        steps=sorted(rows["training_step"].unique().tolist()), iteration=_view_iteration(data, first, iteration),
        message=(f"First {what} value {where} at step {first}, in {listed}. Where it starts is not known: the graph "
                 f"of this step could not be read ({graphs})."),
        evidence={"nan_count": nan_count, "inf_count": inf_count, "nodes": [f"{n}@{i}" for n, i in nodes],
                  "origin_unknown": True, "unreadable_graphs": list(unreadable),
                  "steps_with_non_finite": int(rows["training_step"].nunique())},
        aggregation=_aggregation_of(row), statistic="nan_count" if nan_count > 0 else "inf_count", origin=False,
        column=facts.column.get(node, 0))


def _step_graph(data: TrialData, step: int) -> tuple[dict[Located, set[Located]], dict[str, dict[str, Any]], list[str]]:
    """The dependencies of every iteration of one step, merged, the node documents by name, and the hashes of
    the step's graphs that could not be read."""
    dependencies: dict[Located, set[Located]] = {}
    documents: dict[str, dict[str, Any]] = {}
    unreadable: list[str] = []
    rows = data.steps[data.steps["training_step"] == step]
    for iteration, graph_hash in zip(rows["iteration"].astype(int), rows["graph"]):
        graph = data.graphs.get(graph_hash)
        if graph is None:
            unreadable.append(str(graph_hash))
            continue
        for key, sources in graph_tools.dependencies(graph, iteration).items():
            dependencies.setdefault(key, set()).update(sources)
        for node in graph.get("nodes", []):
            documents.setdefault(node["node"], node)
    return dependencies, documents, sorted(set(unreadable))


def _view_iteration(data: TrialData, step: int, iteration: int) -> int:
    """The iteration to open in the app: a parameter (-1) is shown in the step's first iteration."""
    if iteration >= 0:
        return iteration
    iterations = data.steps.loc[data.steps["training_step"] == step, "iteration"]
    return int(iterations.min()) if len(iterations) else 0


def _pick_row(rows: pd.DataFrame) -> dict[str, Any]:
    """The row to show: the batch mean (or the only row of an unbatched tensor) when it has the problem."""
    if not len(rows):
        return {"role": None, "aggregation": "mean", "sample": -1}
    preference = {"mean": 0, "none": 1, "abs_max": 2, "std": 3, "sample": 4}
    order = [preference.get(str(a), 5) for a in rows["aggregation"]]  # plain ints: categories sort by first seen
    ranked = rows.assign(_p=order).sort_values(["_p", "sample"])
    return ranked.iloc[0].to_dict()


def _aggregation_of(row: dict[str, Any]) -> str:
    aggregation = row.get("aggregation") or "mean"
    return f"sample:{int(row['sample'])}" if aggregation == "sample" else aggregation

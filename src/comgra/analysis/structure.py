"""What the shapes and the graph of a step say: an output and a target whose shapes broadcast, a batch of one
row, tensors that grow within a step (across the iterations of a recurrence, or along one edge of the graph),
and tensors computed from trainable parameters whose gradient never arrives (an accidental ``.detach()``)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from comgra.analysis import module_types
from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.graphs import GraphFacts
from comgra.analysis.loading import TrialData, as_text
from comgra.analysis.trends import _iteration_of
from comgra.store import format as fmt

ITERATION_ORDERS = 2.0  # a tensor whose last iteration is this many powers of ten above its first
EDGE_ORDERS = 2.0  # a tensor this many powers of ten above the tensor it is computed from
MIN_SCALE = 1e-6  # sources below this are at rounding level: no ratio is taken


def shapes(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """The output and the target of a step with shapes that broadcast to a bigger one, and a batch of one row."""
    frame = data.shapes
    if not len(frame):
        return []
    findings = []
    outputs = sorted(n for n, role in facts.role.items() if role == "output")
    targets = frame[frame["tensor_type"] == "target"]
    for target in sorted(set(as_text(targets["node"]))):
        for output in outputs:
            pairs = frame[frame["node"] == output].merge(frame[frame["node"] == target], on="training_step",
                                                          suffixes=("_out", "_target"))
            bad = [(int(s), a, b) for s, a, b in zip(pairs["training_step"], pairs["shape_out"], pairs["shape_target"])
                   if _broadcasts_bigger(a, b)]
            if bad:
                step, a, b = bad[0]
                findings.append(Finding(
                    detector="shape_mismatch", severity="warning", score=0.95, trial=data.trial, node=output,
                    role=output, kind=fmt.FORWARD, training_step=step, steps=[s for s, _, _ in bad],
                    iteration=_iteration_of(data, output, fmt.FORWARD, step),
                    message=f"The output {output} has shape {list(a)} and the target {target} {list(b)}: an "
                            f"element-wise loss broadcasts them to {list(np.broadcast_shapes(a, b))}, comparing every "
                            "output with every target. Reshape one of them.",
                    evidence={"output_shape": list(a), "target_shape": list(b), "steps": len(bad)},
                    aggregation="mean", statistic="mean", column=facts.column.get(output, 0)))
    findings.extend(_single_row(data, facts))
    return findings


def _broadcasts_bigger(a: tuple, b: tuple) -> bool:
    if not a or not b or tuple(a) == tuple(b):
        return False  # equal, or a scalar
    if len(a) == len(b) + 1 and tuple(a[:-1]) == tuple(b) and a[-1] > 1:
        return False  # class scores against class indices
    try:
        joined = np.broadcast_shapes(tuple(a), tuple(b))
    except ValueError:
        return False
    return int(np.prod(joined)) > max(int(np.prod(a)), int(np.prod(b)))


def _single_row(data: TrialData, facts: GraphFacts) -> list[Finding]:
    """Training steps (with gradients) whose input batch has one row, on every recorded step."""
    frame = data.shapes
    trained = set(data.stats.loc[data.stats["kind"] != fmt.FORWARD, "training_step"].unique().tolist())
    inputs = frame[(frame["tensor_type"] == "input") & frame["training_step"].isin(trained)]
    findings = []
    for node in sorted(set(as_text(inputs["node"]))):
        rows = inputs[inputs["node"] == node]
        leading = [s[0] for s in rows["shape"] if len(s) >= 2]
        steps = sorted(int(s) for s in rows["training_step"].unique())
        if len(leading) < len(rows) or len(steps) < 3 or any(n != 1 for n in leading):
            continue
        findings.append(Finding(
            detector="batch_size", severity="warning", score=0.8, trial=data.trial, node=node, role=node,
            kind=fmt.FORWARD, training_step=steps[0], steps=steps, iteration=_iteration_of(data, node, fmt.FORWARD,
                                                                                           steps[0]),
            message=f"Every recorded training step gives {node} a batch of one row (shape {list(rows['shape'].iloc[0])}):"
                    " was the batch dimension lost or a single sample taken by mistake?",
            evidence={"steps": len(steps), "shape": list(rows["shape"].iloc[0])}, aggregation="mean",
            statistic="mean", column=facts.column.get(node, 0)))
    return findings


def growth_within_step(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """A tensor of a recurrence whose magnitude grows by orders of magnitude from its first iteration to its last,
    on most recorded steps."""
    stats = data.stats
    rows = stats[(stats["kind"] == fmt.FORWARD) & (stats["aggregation"] == "abs_max") & (stats["iteration"] >= 0)]
    rows = rows[~rows["tensor_type"].isin(["input", "target", "parameter"])]
    findings = []
    limit = options.orders(ITERATION_ORDERS)
    for (node, role), group in rows.groupby(["node", "role"], sort=True, observed=True):
        if group["iteration"].nunique() < 3:
            continue
        ratios, steps = [], []
        for step, at_step in group.groupby("training_step"):
            ordered = at_step.sort_values("iteration")["abs_mean"].to_numpy(np.float64)
            if len(ordered) >= 3 and ordered[0] > MIN_SCALE and np.isfinite(ordered).all():
                with np.errstate(divide="ignore"):  # a last iteration at 0: -inf, no warning
                    ratios.append(np.log10(ordered[-1] / ordered[0]))
                steps.append(int(step))
        if len(ratios) < options.min_steps:
            continue
        ratios_array = np.asarray(ratios)
        grown = ratios_array > limit
        if grown.mean() < 0.5:
            continue
        orders = float(np.median(ratios_array[grown]))
        flagged = [s for s, g in zip(steps, grown) if g]
        findings.append(Finding(
            detector="growth_within_step", severity="warning", score=min(1.0, 0.5 + 0.1 * orders), trial=data.trial,
            node=str(node), role=str(role), kind=fmt.FORWARD, training_step=flagged[0], steps=flagged,
            iteration=_iteration_of(data, str(node), fmt.FORWARD, flagged[0]),
            message=f"{node} grows {orders:.1f} orders of magnitude within a step, from its first iteration to its "
                    f"last (median over {len(flagged)} of {len(steps)} recorded steps): a recurrence that amplifies "
                    "(a recurrent weight above 1, no squashing function or normalisation).",
            evidence={"orders_of_magnitude": orders, "steps_flagged": len(flagged), "steps": len(steps)},
            aggregation="abs_max", statistic="abs_mean", column=facts.column.get(str(node), 0)))
    return findings


def growth_along_edges(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """A tensor orders of magnitude larger than every tensor it is computed from, on most recorded steps."""
    stats = data.stats
    rows = stats[(stats["kind"] == fmt.FORWARD) & (stats["aggregation"].isin(["abs_max", "none"]))
                 & (stats["tensor_type"] != "parameter")]
    if not len(rows):
        return []
    # One column per node, one row per step: its largest mean absolute value of the step.
    wide = rows.groupby(["training_step", "node"], observed=True)["abs_mean"].max().unstack("node")
    wide.columns = [str(c) for c in wide.columns]
    sources: dict[str, set[str]] = {}
    for source, targets in facts.feeds.items():
        for target in targets:
            sources.setdefault(target, set()).add(source)
    findings = []
    limit = options.orders(EDGE_ORDERS)
    for node in sorted(sources):
        if node not in wide.columns or facts.is_loss_like(node) or facts.role.get(node) in ("input", "target"):
            continue
        if module_types.is_normalisation(data, node):
            continue  # a normalisation sets its output's scale itself (unit scale from 0.02-scale inputs by design)
        inputs = sorted(s for s in sources[node] if s in wide.columns and facts.role.get(s) not in ("parameter", "target"))
        if not inputs:
            continue
        own, biggest = wide[node], wide[inputs].max(axis=1)
        valid = (biggest > MIN_SCALE) & np.isfinite(own) & (own > 0)
        if valid.sum() < options.min_steps:
            continue
        orders = np.log10(own[valid] / biggest[valid])
        grown = orders > limit
        if grown.mean() < 0.5:
            continue
        median = float(np.median(orders[grown]))
        flagged = [int(s) for s in orders.index[grown]]
        findings.append(Finding(
            detector="growth_along_edge", severity="warning", score=min(1.0, 0.5 + 0.1 * median), trial=data.trial,
            node=node, role=node, kind=fmt.FORWARD, training_step=flagged[0], steps=flagged,
            iteration=_iteration_of(data, node, fmt.FORWARD, flagged[0]),
            message=f"{node} is {median:.1f} orders of magnitude larger than the tensors it is computed from "
                    f"({', '.join(inputs[:4])}) on {len(flagged)} of {int(valid.sum())} recorded steps: a layer "
                    "that amplifies far too much (its initialisation, a missing normalisation or scale).",
            evidence={"orders_of_magnitude": median, "sources": inputs, "steps_flagged": len(flagged)},
            aggregation="abs_max", statistic="abs_mean", column=facts.column.get(node, 0)))
    return findings


def detached(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """A tensor computed from parameters (they require gradients), never given a gradient while the tensors around
    it get theirs, and feeding nothing the loss reads: a ``.detach()`` cut the graph behind it."""
    stats = data.stats
    gradient_rows = stats[stats["kind"] != fmt.FORWARD]
    if not len(gradient_rows):
        return []
    with_gradient = set(as_text(gradient_rows["node"]).unique())
    forward = stats[(stats["kind"] == fmt.FORWARD) & (stats["tensor_type"] == "calculated")]
    findings = []
    for node in sorted(set(as_text(forward["node"]).unique())):
        if node in with_gradient or node not in facts.learned or facts.is_loss_like(node):
            continue
        if _reaches_loss(node, facts):
            continue
        parameters = sorted(s for s, targets in facts.feeds.items() if node in targets and facts.role.get(s) == "parameter")
        steps = sorted(int(s) for s in forward.loc[forward["node"] == node, "training_step"].unique())
        findings.append(Finding(
            detector="accidental_detach", severity="warning", score=0.8, trial=data.trial, node=node, role=node,
            kind=fmt.FORWARD, training_step=steps[0], steps=steps, iteration=_iteration_of(data, node, fmt.FORWARD,
                                                                                           steps[0]),
            message=f"{node} is computed from trainable parameters ({', '.join(parameters[:4])}) but never gets a "
                    "gradient, while other tensors of the same steps do, and nothing it feeds reaches the loss: is "
                    "it detached (.detach(), .item(), .numpy(), torch.no_grad()) where it should not be? A frozen "
                    "module's output needs no gradient, but then its parameters do not require one either.",
            evidence={"parameters": parameters, "steps": len(steps)}, aggregation="mean", statistic="mean",
            column=facts.column.get(node, 0)))
    return findings


def _reaches_loss(node: str, facts: GraphFacts) -> bool:
    seen, todo = {node}, [node]
    while todo:
        current = todo.pop()
        for target in facts.feeds.get(current, ()):
            if facts.is_loss_like(target) or facts.role.get(target) == "output":
                return True
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return False

"""The course of a run as a whole: a loss that does not decrease, diverges or stays at chance, inputs or targets
that are the same for every sample, and steps where a tensor's scale jumps for a moment.

The loss is judged against itself (its first recorded quarter against its last), chance against the number of
classes the output has; a jump against the other steps of the same type of execution (training and evaluation
passes are compared each with its own kind).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from comgra.analysis import parameters
from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.graphs import GraphFacts
from comgra.analysis.loading import TrialData, as_text, row_types
from comgra.analysis.trends import _iteration_of
from comgra.store import format as fmt

MIN_LOSS_STEPS = 20  # a shorter curve is too noisy to say it does not decrease
# A loss that ends within this fraction of where it started has not decreased (relative to its start).
NOT_DECREASING = 0.05
DIVERGING_FACTOR = 10.0  # a loss that ends this many times larger in magnitude than it started diverges
CHANCE_MARGIN = 0.05  # a cross-entropy within this fraction of log(classes) is at chance
# A loss at chance is stuck, not a plateau before the fall, once the optimizer has moved the parameters this many of
# their own steps away from where the recording began (the median trained parameter), the loss in its band throughout.
MOVED_STEPS = 25.0
JUMP_ORDERS = 2.0  # a step whose scale is this many powers of ten above the other steps of its type
MIN_STEPS_PER_TYPE = 5
BOUND_TOUCH = 0.01  # an output within this share of its reach from a bound presses against it
SAMPLE_STATISTICS = ["mean", "abs_mean", "std", "min", "max", "abs_max"]  # the per-sample statistics recorded


def loss_curve(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """The loss of the training steps over the run: diverging, stuck at chance, or not decreasing."""
    series = _loss_series(data, facts)
    if series is None:
        return []
    node, steps, values = series
    quarter = max(2, len(values) // 4)
    early, late = float(np.median(values[:quarter])), float(np.median(values[-quarter:]))
    trend = _spearman(steps, values)
    base: dict[str, Any] = dict(trial=data.trial, node=node, role=node, kind=fmt.FORWARD, steps=[int(s) for s in steps],
                aggregation="none", statistic="mean", column=facts.column.get(node, 0))
    evidence = {"first_quarter": early, "last_quarter": late, "spearman_with_step": trend, "steps": len(values)}
    if abs(late) >= options.scaled(1.0) * DIVERGING_FACTOR * max(abs(early), 1e-12) and \
            abs(trend) >= 0.5 and (late > early or late < 0):
        direction = "grows" if late > early else "falls below zero and keeps falling"
        return [Finding(detector="loss_diverging", severity="warning", score=min(1.0, 0.6 + 0.1 * math.log10(
            abs(late) / max(abs(early), 1e-12))), training_step=int(steps[-1]),
            iteration=_iteration_of(data, node, fmt.FORWARD, int(steps[-1])),
            message=f"The loss {node} {direction}: {early:.3g} in the first quarter of the recorded training steps, "
                    f"{late:.3g} in the last. " + ("A loss that falls below zero without bound is maximised, not "
                                                  "minimised: is its sign flipped?" if late < 0 else
                                                  "The learning rate, the loss's reduction or the data's scale?"),
            evidence={**evidence, "orders_of_magnitude": math.log10(abs(late) / max(abs(early), 1e-12))}, **base)]
    classes = _classes(data, facts)
    if classes and classes >= 2 and early > 0:
        stuck = _at_chance(data, node, steps, values, classes, evidence, base)
        if stuck is not None:
            return [stuck]
    decrease = (early - late) / max(abs(early), 1e-12)
    if early > 0 and decrease < options.scaled(NOT_DECREASING) and trend > -0.5:
        return [Finding(detector="loss_not_decreasing", severity="warning", score=0.7 + 0.2 * min(1.0, -decrease),
                        training_step=int(steps[0]), iteration=_iteration_of(data, node, fmt.FORWARD, int(steps[0])),
                        message=f"The loss {node} does not decrease: {early:.3g} in the first quarter of the recorded "
                                f"training steps, {late:.3g} in the last ({decrease:+.1%}). Do the parameters change "
                                "(learning rate, clipping, optimizer), and can the output reach the target?",
                        evidence={**evidence, "relative_decrease": decrease}, **base)]
    return []


def _at_chance(data: TrialData, node: str, steps: np.ndarray, values: np.ndarray, classes: int,
               evidence: dict[str, Any], base: dict[str, Any]) -> Finding | None:
    """A classifier's loss at chance (log of its classes) over the whole recorded run: a warning where the optimizer
    has moved the parameters well past its step size (``MOVED_STEPS`` of them, net) and the loss never left its
    band; an info while the run is too short to tell it from a plateau before the fall. None where it leaves."""
    chance = math.log(classes)
    window = max(3, len(values) // 10)  # one noisy batch is not leaving the band; a few steps in a row are
    smoothed = pd.Series(values).rolling(window, min_periods=1, center=True).median().to_numpy()
    # An initialisation whose logits are not yet uniform starts above chance, and the optimizer first learns the
    # uniform guess: the loss must be in its band by the end of the first quarter and never leave it after, and never
    # fall below it anywhere (below chance, it has learned something).
    off = np.abs(smoothed - chance) / chance
    settled = max(1, len(values) // 4)
    if off[settled:].max() > CHANCE_MARGIN or (smoothed < chance * (1 - CHANCE_MARGIN)).any():
        return None
    off = off[settled:]
    moved = _moved_steps(data)
    stuck = moved is not None and moved >= MOVED_STEPS
    evidence = {**evidence, "chance": chance, "classes": classes, "largest_distance_from_chance": float(off.max()),
                "moved_steps": moved}
    late = float(np.median(values[-max(2, len(values) // 4):]))
    message = (f"The loss {node} stays at chance over all {len(values)} recorded training steps (steps {int(steps[0])} "
               f"to {int(steps[-1])}): {late:.3g} at the end, never below its band and, from step {int(steps[settled])} on, never more "
               f"than {off.max():.1%} from the "
               f"{chance:.3g} = log({classes}) of a classifier that guesses among its {classes} classes. ")
    if stuck:
        message += (f"The optimizer has moved the parameters {moved:.0f} of its steps away from where they started, "
                    "and the loss did not follow: do the labels belong to the inputs (shuffled separately, the "
                    "wrong column), does the input reach the output?")
    else:
        moved_text = "not far" if moved is None else f"only {moved:.0f} of its steps"
        message += (f"The optimizer has moved the parameters {moved_text} from where they started: too early to "
                    f"tell a plateau before the fall from labels that do not belong to the inputs (a warning once "
                    f"they have moved {MOVED_STEPS:.0f} steps and the loss has not left).")
    return Finding(detector="loss_stuck", severity="warning" if stuck else "info", score=0.85 if stuck else 0.4,
                   training_step=int(steps[0]), iteration=_iteration_of(data, node, fmt.FORWARD, int(steps[0])),
                   message=message, evidence=evidence, **base)


def _moved_steps(data: TrialData) -> float | None:
    """How far the optimizer has moved the parameters, in its own steps: per trained parameter, the distance between
    its first and last recorded statistics over the median change per training step; the median over parameters.
    Noise that goes back and forth stays near the square root of the steps, a drift grows with them."""
    ratios = []
    for part in parameters.parts(data).values():
        if part.gradient <= 0 or len(part.steps) < 3:
            continue
        per_step = float(np.median(part.changes / np.maximum(np.diff(part.steps), 1)))
        if per_step > 0:
            ratios.append(float(np.linalg.norm(part.last - part.first)) / per_step)
    return float(np.median(ratios)) if ratios else None


def _loss_series(data: TrialData, facts: GraphFacts) -> tuple[str, np.ndarray, np.ndarray] | None:
    """The registered loss (tensor type ``loss``) of the steps that computed gradients, one value per step."""
    stats = data.stats
    rows = stats[(stats["kind"] == fmt.FORWARD) & (stats["tensor_type"] == "loss")]
    rows = rows[np.isfinite(rows["mean"].astype(np.float64))]
    trained = _trained_steps(data)
    rows = rows[rows["training_step"].isin(trained)]
    if not len(rows):
        return None
    nodes = as_text(rows["node"])
    node = str(nodes.value_counts().index[0])
    per_step = rows[nodes == node].groupby("training_step")["mean"].mean().sort_index()
    if len(per_step) < MIN_LOSS_STEPS:
        return None
    return node, per_step.index.to_numpy(np.int64), per_step.to_numpy(np.float64)


def _trained_steps(data: TrialData) -> set[int]:
    """Steps that recorded a gradient: training steps, not evaluation passes."""
    stats = data.stats
    return set(stats.loc[stats["kind"] != fmt.FORWARD, "training_step"].unique().tolist())


def _classes(data: TrialData, facts: GraphFacts) -> int | None:
    """The number of classes of a classifier: the width of its output when its target holds integer labels."""
    shapes = data.shapes
    if not len(shapes):
        return None
    outputs = [n for n, role in facts.role.items() if role == "output"]
    targets = shapes[shapes["tensor_type"] == "target"]
    if len(outputs) != 1:
        return None
    out_shapes = shapes[shapes["node"] == outputs[0]]["shape"]
    if not len(targets):  # no target registered (comgra.watch): the logits' width, where the output has a batch axis
        widths = {tuple(shape)[-1] for shape in out_shapes if len(shape) >= 2}
        return int(widths.pop()) if len(widths) == 1 and min(widths) >= 2 else None
    target_rows = data.stats[(data.stats["tensor_type"] == "target") & (data.stats["aggregation"] == "sample")]
    if not len(out_shapes) or not len(target_rows):
        return None
    output_shape, target_shape = out_shapes.iloc[0], targets["shape"].iloc[0]
    if len(output_shape) != len(target_shape) + 1 or tuple(output_shape[:-1]) != tuple(target_shape):
        return None
    # Labels are whole numbers of at least 0 (each sample's value is its label).
    labels = target_rows[["min", "max"]].astype(np.float64)
    if (labels["min"] < 0).any() or not np.allclose(labels.to_numpy(), np.round(labels.to_numpy())):
        return None
    return int(output_shape[-1])


def constant_data(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """An input or a target that is the same for every sample on every recorded step (or zero everywhere)."""
    stats = data.stats
    rows = stats[(stats["kind"] == fmt.FORWARD) & stats["tensor_type"].isin(["input", "target"])
                 & (stats["aggregation"] == "std")]
    findings = []
    constant, varying = [], set()
    for (node, role), group in rows.groupby(["node", "role"], sort=True, observed=True):
        steps = sorted(int(s) for s in group["training_step"].unique())
        # The "std" row holds each per-sample statistic's spread over the batch: data that is the same for every
        # sample has none in any of them. A spread of 0 in one statistic alone is not that: images clamped to a
        # range all reach its bound (their maximum never varies), masks without padding all reach 1.
        if len(steps) < options.min_steps or not (group[SAMPLE_STATISTICS] == 0).all(axis=None):
            if str(group["tensor_type"].iloc[0]) == "input" and len(steps) >= options.min_steps:
                varying.add(str(node))
            continue
        constant.append((node, role, group, steps))
    for node, role, group, steps in constant:
        rows_of_node = data.shapes[data.shapes["node"] == node]["shape"] if len(data.shapes) else []
        if any(len(shape) and shape[0] == 1 for shape in rows_of_node):
            continue  # a batch of one row has no spread to speak of (the batch-size finding says so)
        values = stats[(stats["node"] == node) & (stats["aggregation"] == "mean") & (stats["kind"] == fmt.FORWARD)]
        zero = bool(len(values)) and bool((values["abs_max"] == 0).all())
        kind = str(group["tensor_type"].iloc[0])
        what = "zero for every sample" if zero else "the same for every sample"
        # An input beside others that vary (an attention mask without padding beside the token ids) is a constant
        # companion of the signal, not the signal: the network still sees its data. An input that is zero
        # everywhere is not (data or a mask zeroed in transit).
        companion = kind == "input" and bool(varying) and not zero
        signal = (f"the other inputs ({', '.join(sorted(varying)[:3])}) vary, so this one carries no information "
                  "on these steps (an attention mask without padding, a constant flag): normal unless it should vary."
                  if companion else "the network sees no signal.")
        findings.append(Finding(
            detector="constant_input" if kind == "input" else "constant_target",
            severity="info" if companion else "warning", score=0.3 if companion else 0.9,
            trial=data.trial, node=str(node), role=str(role), kind=fmt.FORWARD, training_step=steps[0], steps=steps,
            iteration=_iteration_of(data, str(node), fmt.FORWARD, steps[0]),
            message=f"The {kind} {node} is {what} in all {len(steps)} recorded steps: "
                    + (signal if kind == "input" else "there is nothing to learn. Is it read "
                                                                               "from the right field?"),
            evidence={"steps": len(steps), "all_zero": zero}, aggregation="std", statistic="abs_max",
            column=facts.column.get(str(node), 0)))
    return findings


def transient_jumps(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """Steps where a forward tensor's typical magnitude is orders of magnitude above the other steps of its type
    (training and evaluation passes apart). One warning per jump, at the earliest node that shows it."""
    stats = data.stats
    rows = stats[(stats["kind"] == fmt.FORWARD) & stats["aggregation"].isin(["abs_max", "none"])
                 & (stats["tensor_type"] != "parameter")]
    rows = rows[np.isfinite(rows["abs_mean"].astype(np.float64))]
    if not len(rows):
        return []
    # A step is (number, type): an evaluation may share a training step's number (the Trainer's global_step).
    rows = rows.assign(type=row_types(rows, data.steps))
    per_step = rows.groupby(["node", "role", "training_step", "type"], observed=True)["abs_mean"].max().reset_index()
    per_step = per_step.assign(node=as_text(per_step["node"]), role=as_text(per_step["role"]))
    limit = options.orders(JUMP_ORDERS)
    jumps: dict[int, list[tuple[int, str, str, float, float, str]]] = {}
    for (node, role, step_type), series in per_step.groupby(["node", "role", "type"], sort=True):
        if len(series) < MIN_STEPS_PER_TYPE or facts.is_loss_like(node):
            continue
        logs = np.log10(series["abs_mean"].to_numpy(np.float64) + 1e-30)
        typical = np.median(logs)
        if typical < np.log10(1e-6):
            continue  # a tensor at zero most of the time (dead units, a masked value): no scale to jump from
        spread = np.median(np.abs(logs - typical))
        above = logs - typical
        flagged = np.flatnonzero(above > max(limit, 6 * spread))
        if not 0 < len(flagged) <= max(1, len(logs) // 10) and not _isolated(flagged, len(logs)):
            continue  # a level that holds for many steps is a trend (growth, collapse), not a jump
        for index in flagged:
            step = int(series["training_step"].iloc[index])
            jumps.setdefault(step, []).append((facts.column.get(node, 0), node, role, float(above[index]),
                                               float(10 ** typical), str(step_type)))
    findings = []
    for step, found in sorted(jumps.items()):
        found.sort(key=lambda f: (f[0], -f[3], f[1]))
        column, node, role, orders, typical, step_type = found[0]
        spread_to = [f[1] for f in found[1:]]
        findings.append(Finding(
            detector="transient_jump", severity="warning", score=min(1.0, 0.5 + 0.1 * orders), trial=data.trial,
            node=node, role=role, kind=fmt.FORWARD, training_step=step, steps=[step],
            iteration=_iteration_of(data, node, fmt.FORWARD, step),
            message=f"At step {step} ({step_type}) the values of {node} jump {orders:.1f} orders of magnitude above "
                    f"their level on the other {step_type} steps (typically {typical:.3g}) and fall back after it"
                    + (f"; it shows in {', '.join(spread_to[:5])} too." if spread_to else "."),
            evidence={"orders_of_magnitude": orders, "typical_abs_mean": typical, "type_of_execution": step_type,
                      "spread_to": spread_to}, aggregation="abs_max", statistic="abs_mean", column=column))
    return findings


def _isolated(flagged: np.ndarray, count: int) -> bool:
    """Jumps on fewer than half of a type's steps, each alone (its neighbours are at the usual level) and the last step
    not among them: the values fall back after every one, so no level was reached. The few evaluation passes of a
    run, a bad shard met on two of them, are flagged though more than a tenth of them jumped."""
    if not 0 < len(flagged) < count / 2 or flagged[-1] == count - 1:
        return False
    return bool(np.all(np.diff(flagged) > 1))


def _spearman(steps: np.ndarray, values: np.ndarray) -> float:
    if len(set(values.tolist())) < 2:
        return 0.0
    rho = scipy_stats.spearmanr(steps, values).statistic
    return float(rho) if np.isfinite(rho) else 0.0


def output_range(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """An output bounded on one side (a ReLU, a sigmoid on it) against a target of the same shape beyond that bound
    on most recorded steps: the loss can never reach zero there."""
    stats = data.stats
    rows = stats[(stats["kind"] == fmt.FORWARD) & (stats["aggregation"] == "sample")]
    shapes = data.shapes
    findings = []
    outputs = sorted(n for n, role in facts.role.items() if role == "output")
    targets = sorted(set(as_text(rows.loc[rows["tensor_type"] == "target", "node"])))
    for output in outputs:
        for target in targets:
            if len(shapes) and not _same_shape(shapes, output, target):
                continue
            out = rows[rows["node"] == output].groupby("training_step")[["min", "max"]].agg({"min": "min", "max": "max"})
            aim = rows[rows["node"] == target].groupby("training_step")[["min", "max"]].agg({"min": "min", "max": "max"})
            both = out.merge(aim, left_index=True, right_index=True, suffixes=("_out", "_target")).astype(np.float64)
            if len(both) < options.min_steps:
                continue
            scale = np.maximum(both["max_target"].abs(), both["min_target"].abs()).median()
            margin = 0.1 * scale
            # The output must press against its bound (an activation that clips it), not merely stay on one side.
            reach = np.maximum(both["max_out"].abs(), both["min_out"].abs())
            at_zero_below = (both["min_out"] <= BOUND_TOUCH * reach).mean() >= 0.5
            at_zero_above = (both["max_out"] >= -BOUND_TOUCH * reach).mean() >= 0.5
            problem = None
            if (both["min_out"] >= 0).all() and at_zero_below and ((both["min_target"] < -margin).mean() >= 0.5):
                problem = ("never negative", "negative", float(both["min_target"].min()))
            elif (both["max_out"] <= 0).all() and at_zero_above and ((both["max_target"] > margin).mean() >= 0.5):
                problem = ("never positive", "positive", float(both["max_target"].max()))
            elif (both["min_out"] >= 0).all() and (both["max_out"] <= 1).all() and (
                    (both["max_out"] >= 1 - 10 * BOUND_TOUCH).mean() >= 0.5) and (
                    (both["max_target"] > 1 + margin).mean() >= 0.5):
                problem = ("within [0, 1]", "above 1", float(both["max_target"].max()))
            if problem is None:
                findings.extend(_target_scale(data, facts, output, target, both))
                continue
            steps = [int(s) for s in both.index]
            findings.append(Finding(
                detector="output_range", severity="warning", score=0.9, trial=data.trial, node=output, role=output,
                kind=fmt.FORWARD, training_step=steps[0], steps=steps,
                iteration=_iteration_of(data, output, fmt.FORWARD, steps[0]),
                message=f"The output {output} is {problem[0]} on every recorded step, but its target {target} is "
                        f"{problem[1]} on most of them (down to {problem[2]:.3g}): the output cannot match it. Is an "
                        "activation (ReLU, sigmoid, softmax) applied to an output that should be unbounded?",
                evidence={"target_extreme": problem[2], "steps": len(steps)}, aggregation="mean", statistic="min",
                column=facts.column.get(output, 0)))
    return findings


def _same_shape(shapes: pd.DataFrame, a: str, b: str) -> bool:
    first = shapes[shapes["node"] == a]["shape"]
    second = shapes[shapes["node"] == b]["shape"]
    return bool(len(first)) and bool(len(second)) and tuple(first.iloc[0]) == tuple(second.iloc[0])


TARGET_SCALE_ORDERS = 2.0  # a target this many powers of ten larger than the output it is compared with, at the start


def _target_scale(data: TrialData, facts: GraphFacts, output: str, target: str, both: pd.DataFrame) -> list[Finding]:
    """A target of the same shape as the output, orders of magnitude larger on the first recorded step (before the
    updates it causes move the output): targets not normalised (prices in dollars against an output near 0)."""
    first = both.iloc[:1]
    target_scale = float(np.median(np.maximum(first["max_target"].abs(), first["min_target"].abs())))
    output_scale = float(np.median(np.maximum(first["max_out"].abs(), first["min_out"].abs())))
    if not (np.isfinite(target_scale) and np.isfinite(output_scale)) or output_scale <= 0:
        return []
    orders = math.log10(max(target_scale, 1e-30) / output_scale)
    if orders < TARGET_SCALE_ORDERS:
        return []
    steps = [int(s) for s in first.index]
    return [Finding(
        detector="target_scale", severity="warning", score=min(1.0, 0.6 + 0.1 * orders), trial=data.trial,
        node=target, role=target, kind=fmt.FORWARD, training_step=steps[0], steps=steps,
        iteration=_iteration_of(data, target, fmt.FORWARD, steps[0]),
        message=f"The target {target} reaches {target_scale:.3g} where the output {output} it is compared with "
                f"reaches {output_scale:.3g} on the first recorded step ({orders:.1f} orders of magnitude apart): "
                "normalise the targets (and undo it on the predictions), or the first updates are huge.",
        evidence={"orders_of_magnitude": orders, "target_scale": target_scale, "output_scale": output_scale},
        aggregation="mean", statistic="abs_max", column=facts.column.get(target, 0))]


def probabilities_to_loss(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """A classifier's output of probabilities (within (0, 1) on every step, never exactly 0: a softmax) compared with
    class indices: a loss that takes logits (cross-entropy) applies its own softmax to it again."""
    stats = data.stats
    shapes = data.shapes
    if not len(shapes):
        return []
    rows = stats[(stats["kind"] == fmt.FORWARD) & (stats["aggregation"] == "sample")]
    findings = []
    for output in sorted(n for n, role in facts.role.items() if role == "output"):
        classes = _classes(data, facts)
        values = rows[rows["node"] == output]
        steps = sorted(int(s) for s in values["training_step"].unique())
        if not classes or classes < 2 or len(steps) < options.min_steps:
            continue
        low, high = float(values["min"].min()), float(values["max"].max())
        if not (0 < low and high <= 1):
            continue
        findings.append(Finding(
            detector="probabilities_to_logit_loss", severity="warning", score=0.85, trial=data.trial, node=output,
            role=output, kind=fmt.FORWARD, training_step=steps[0], steps=steps,
            iteration=_iteration_of(data, output, fmt.FORWARD, steps[0]),
            message=f"The output {output} holds probabilities (within ({low:.3g}, {high:.3g}] on every recorded step, "
                    f"never 0) over {classes} classes and is compared with class indices: CrossEntropyLoss and "
                    "nll_loss take logits and log-probabilities, so a softmax before them flattens the loss. Drop the "
                    "softmax (or take log_softmax).",
            evidence={"min": low, "max": high, "classes": classes}, aggregation="sample:0", statistic="max",
            column=facts.column.get(output, 0)))
    return findings

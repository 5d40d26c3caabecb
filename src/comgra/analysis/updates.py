"""Parameter updates judged against the run's own history and against absolute scales, not only against the
other nodes of a step: parameters that stop changing partway, that shrink by orders of magnitude, updates far
below any learning, and gradients that keep growing because they are never reset (not the current step's)."""
from __future__ import annotations

import numpy as np
from scipy import stats as scipy_stats

from comgra.analysis import parameters
from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.graphs import GraphFacts
from comgra.analysis.loading import TrialData, as_text
from comgra.store import format as fmt

MIN_PAIRS = 6  # consecutive recorded steps of a parameter needed to speak of its history
STOPPED_FRACTION = 0.25  # the last this much of the pairs (at least 3) without any change
SHRINK_ORDERS = 1.0  # a weight whose norm falls this many powers of ten, steadily
TINY_UPDATE = 1e-5  # relative change per step below which a parameter with a gradient is not learning
TINY_SHARE = 2 / 3  # of the parameters: the whole run's updates are tiny (learning rate, clipping), not one layer's
STALE_GROWTH = 4.0  # gradients that end this many times larger than they started, steadily, in most parameters
STALE_SHARE = 0.6
# ... or that grow by this much while the loss falls by LOSS_FALL or more: the gradient of a loss near its minimum
# is small, so gradients that grow as it falls are not this step's gradients.
STALE_GROWTH_WITH_FALLING_LOSS = 2.0
LOSS_FALL = 10.0
ACCUMULATION_SLACK = 2.0  # growth up to this many times the ratio of the steps summed is still accumulation
RISING_LOSS_MARGIN = 3.0  # under a rising loss, gradients must grow this many times more than the loss rises


def updates(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    found = parameters.parts(data)
    findings: list[Finding] = []
    tiny = []
    for (node, role), part in found.items():
        if len(part.steps) < MIN_PAIRS + 1 or not (part.gradient > 0 and np.isfinite(part.gradient)):
            continue
        finding = _stopped(data, facts, node, role, part, options) or _shrinking(data, facts, node, role, part,
                                                                                 options)
        if finding is None:
            small = _tiny(data, facts, node, role, part, options)
            if small is not None:
                tiny.append(small)
        if finding is not None:
            findings.append(finding)
    judged = sum(1 for part in found.values() if part.width >= parameters.MIN_UNITS_FOR_RATIO and len(part.steps) > MIN_PAIRS)
    if tiny and len(tiny) < TINY_SHARE * judged:
        return findings  # tiny updates in some layers only: their gradient's doing (the gradient detectors say so)
    return findings + tiny


def _base(data: TrialData, facts: GraphFacts, node: str, role: str, steps: list[int], first: int) -> dict:
    return dict(trial=data.trial, node=node, role=role, kind=fmt.FORWARD, training_step=first, steps=steps,
                iteration=parameters._first_iteration(data, first), aggregation="none",
                column=facts.column.get(node, 0))


def _stopped(data: TrialData, facts: GraphFacts, node: str, role: str, part: parameters.ParameterPart,
             options: ScanOptions) -> Finding | None:
    moving = part.changes > 0
    if not moving.any() or moving[-1]:
        return None
    last_move = int(np.flatnonzero(moving)[-1])
    still = len(moving) - last_move - 1
    if still < max(3, STOPPED_FRACTION * len(moving) / options.sensitivity) or moving[:last_move + 1].mean() < 0.8:
        return None
    steps = part.steps.astype(int).tolist()
    stop = steps[last_move + 1]
    dtype = parameters._runinfo_by_name(data, "dtype").get(role, "").removeprefix("torch.")
    if dtype in parameters.MANTISSA_BITS:  # its steps shrank below what the format resolves: rounding, by design
        return Finding(detector="parameter_stopped", severity="info", score=0.4, statistic="mean",
                       message=f"{role} changes until step {stop} and not at all in the {still} recorded steps after "
                               f"it, although it gets a gradient (up to {part.gradient:.3g}): it is stored in {dtype}, "
                               "where an update below half the format's resolution at its values rounds back to the "
                               "old value (a decaying learning rate makes the updates that small). Keep float32 "
                               "master weights if it should go on learning.",
                       evidence={"stopped_at": stop, "still_pairs": still, "moving_pairs": int(moving.sum()),
                                 "max_gradient": part.gradient, "cause": "rounding", "dtype": dtype},
                       **_base(data, facts, node, role, steps[last_move + 1:], stop))
    return Finding(detector="parameter_stopped", severity="warning", score=0.85, statistic="mean",
                   message=f"{role} changes until step {stop} and not at all in the {still} recorded steps after it, "
                           f"although it gets a gradient (up to {part.gradient:.3g}): did a learning-rate schedule "
                           "reach 0, or was it left out of an optimizer built partway?",
                   evidence={"stopped_at": stop, "still_pairs": still, "moving_pairs": int(moving.sum()),
                             "max_gradient": part.gradient}, **_base(data, facts, node, role, steps[last_move + 1:], stop))


def _shrinking(data: TrialData, facts: GraphFacts, node: str, role: str, part: parameters.ParameterPart,
               options: ScanOptions) -> Finding | None:
    if part.width < parameters.MIN_UNITS_FOR_RATIO:
        return None
    norms = np.append(part.norms, np.linalg.norm(part.last[: part.width]))
    if norms[0] <= 0 or not np.isfinite(norms).all():
        return None
    quarter = max(2, len(norms) // 4)
    early, late = float(np.median(norms[:quarter])), float(np.median(norms[-quarter:]))
    orders = np.log10(early / max(late, 1e-30))
    trend = _trend(norms)
    if orders < options.orders(SHRINK_ORDERS) or not trend < -0.8:
        return None
    steps = part.steps.astype(int).tolist()
    return Finding(detector="parameter_shrinking", severity="warning", score=min(1.0, 0.5 + 0.2 * orders),
                   statistic="abs_mean",
                   message=f"{role} shrinks {orders:.1f} orders of magnitude over training (norm {early:.3g} in the "
                           f"first quarter of the recorded steps, {late:.3g} in the last) and keeps shrinking: "
                           "weight decay far too strong for the learning rate?",
                   evidence={"orders_of_magnitude": float(orders), "first_quarter_norm": early,
                             "last_quarter_norm": late, "spearman_with_step": float(trend)},
                   **_base(data, facts, node, role, steps, steps[0]))


def _tiny(data: TrialData, facts: GraphFacts, node: str, role: str, part: parameters.ParameterPart,
          options: ScanOptions) -> Finding | None:
    if part.width < parameters.MIN_UNITS_FOR_RATIO:
        return None
    steps = part.steps.astype(int).tolist()
    gaps = np.maximum(np.diff(np.asarray(steps, dtype=np.float64)), 1.0)
    valid = part.norms > 0
    if valid.sum() < MIN_PAIRS:
        return None
    ratio = float(np.median(part.changes[valid] / part.norms[valid] / gaps[valid]))
    if not 0 < ratio < TINY_UPDATE / options.sensitivity:
        return None
    return Finding(detector="update_ratio", severity="warning", score=min(1.0, 0.6 + 0.1 * np.log10(TINY_UPDATE / ratio)),
                   statistic="abs_max",
                   message=f"The updates of {role} are far too small to learn: each training step changes it by "
                           f"{ratio:.2g} of its size (median; a parameter that learns moves about 1e-4 to 1e-2 of "
                           f"its size), although it gets a gradient. The learning rate, gradient clipping?",
                   evidence={"update_to_weight_ratio": ratio, "pairs": int(valid.sum()),
                             "orders_of_magnitude": float(np.log10(TINY_UPDATE / ratio))},
                   **_base(data, facts, node, role, steps, steps[0]))


def pace(part: parameters.ParameterPart) -> float | None:
    """The median relative change of a parameter per training step (None with too few recorded steps)."""
    steps = np.asarray(part.steps, dtype=np.float64)
    valid = part.norms > 0
    if len(steps) < 3 or valid.sum() < 2:
        return None
    gaps = np.maximum(np.diff(steps), 1.0)
    return float(np.median(part.changes[valid] / part.norms[valid] / gaps[valid]))


def stale_gradients(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """Gradients that grow steadily in most parameters at once: summed over steps (zero_grad never called)."""
    stats = data.stats
    rows = stats[(stats["kind"] != fmt.FORWARD) & (stats["tensor_type"] == "parameter")
                 & (stats["aggregation"] == "none")]
    rows = rows[np.isfinite(rows["abs_mean"].astype(np.float64))]
    grown = []
    total = 0
    fall = loss_fall(data)
    if fall is None:
        return []
    # A loss that grows explains gradients that grow as much (a divergence); gradients that grow far more than the
    # loss does (a cross-entropy that rises 2x under gradients 100x larger) are not this step's: they are summed.
    rising = fall < 1.0
    needed = STALE_GROWTH_WITH_FALLING_LOSS if fall >= LOSS_FALL else STALE_GROWTH
    for (node, kind), group in rows.groupby(["node", "kind"], sort=True, observed=True):
        series = group.groupby("training_step")["abs_mean"].max().sort_index()
        if len(series) < MIN_PAIRS + 2:
            continue
        total += 1
        values = series.to_numpy(np.float64)
        quarter = max(2, len(values) // 4)
        early, late = float(np.median(values[:quarter])), float(np.median(values[-quarter:]))
        if not early > 0 or late / early < needed / options.sensitivity:
            continue
        trend = _trend(values)
        # A sum of a step's gradients grows at most as fast as the number of steps summed: growth far beyond that is
        # not accumulation (an explosion, a loss pushing back), whatever else it is.
        at = series.index.to_numpy(np.float64) - float(series.index.min()) + 1.0
        summed = float(np.median(at[-quarter:])) / float(np.median(at[:quarter]))
        if rising and late / early < RISING_LOSS_MARGIN / fall:
            continue  # grows about as much as the loss rises: the loss's own gradient
        if early > 0 and late / early > ACCUMULATION_SLACK * summed and not rising:
            continue
        if early > 0 and late / early >= needed / options.sensitivity and trend > (0.5 if needed < STALE_GROWTH else 0.8):
            grown.append((late / early, float(trend), str(node), str(kind), series))
    if not total or len(grown) < STALE_SHARE * total or len(grown) < 2:
        return []
    grown.sort(key=lambda g: (-g[0], g[2]))
    factor, trend, node, kind, series = grown[0]
    steps = [int(s) for s in series.index]
    return [Finding(
        detector="stale_gradient", severity="warning", score=min(1.0, 0.6 + 0.1 * np.log10(factor) + 0.2 * len(grown) / total),
        trial=data.trial, node=node, role=node, kind=kind, training_step=steps[0], steps=steps,
        iteration=parameters._first_iteration(data, steps[0]),
        message=f"The gradients of {len(grown)} of {total} parameters grow steadily over training ({node}: "
                f"{factor:.1f}x from the first quarter of the recorded steps to the last, Spearman {trend:.2f}) "
                + (f"while the loss rises only {1 / fall:.3g}x: " if rising else f"while the loss falls {fall:.3g}x: ")
                + "gradients that are summed over steps rather than the current step's. Is optimizer.zero_grad() "
                "called every step?",
        evidence={"growth_factor": factor, "loss_fall": fall, "parameters_growing": len(grown), "parameters": total,
                  "growing": sorted(g[2] for g in grown)[:20], "orders_of_magnitude": float(np.log10(factor))},
        aggregation="none", statistic="abs_mean", column=facts.column.get(node, 0))]


def _trend(values: np.ndarray) -> float:
    """Spearman's rho of the values with their order (0 for a constant series)."""
    if len(set(values.tolist())) < 2:
        return 0.0
    rho = scipy_stats.spearmanr(np.arange(len(values)), values).statistic
    return float(rho) if np.isfinite(rho) else 0.0


def loss_fall(data: TrialData) -> float | None:
    """How many times smaller the registered loss is in the last quarter of the steps than in the first (positive
    losses only; None without one)."""
    stats = data.stats
    rows = stats[(stats["kind"] == fmt.FORWARD) & (stats["tensor_type"] == "loss")]
    return fall_of(rows.groupby("training_step")["mean"].mean().sort_index().to_numpy(np.float64))


def fall_of(per_step: np.ndarray) -> float | None:
    """``loss_fall`` of the loss's values, one per step in the order of the steps."""
    per_step = per_step[np.isfinite(per_step)]
    if len(per_step) < MIN_PAIRS:
        return None
    quarter = max(2, len(per_step) // 4)
    early, late = float(np.median(per_step[:quarter])), float(np.median(per_step[-quarter:]))
    if early <= 0 or late < 0:
        return None
    return early / max(late, 1e-30)

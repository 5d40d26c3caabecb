"""Gradients that vanish or explode, tensors that grow without bound, batches that collapse.

Magnitudes are compared in powers of ten: a gradient against the largest gradient of the same
step (vanishing, exploding), a statistic of the last quarter of training against the first
(growth, collapse).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.graphs import GraphFacts
from comgra.analysis.loading import TrialData, as_text
from comgra.store import format as fmt

NOT_LEARNED = ("input", "target", "initial_value")
STANDS_OUT = 10.0  # growth is reported only for a tensor that ends this many times above the typical one


def gradients(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """Nodes whose gradient is orders of magnitude below or above the largest one of their step."""
    per_node = gradient_levels(data, facts)
    return [] if per_node is None else gradients_from_levels(data, facts, options, per_node)


def gradient_levels(data: TrialData, facts: GraphFacts) -> pd.DataFrame | None:
    """Per kind, step, node and role: the log10 of the node's largest mean absolute gradient (one float per
    node and step: what a streamed scan keeps of the gradients of each node group)."""
    stats = data.stats
    rows = stats[(stats["kind"] != fmt.FORWARD) & stats["aggregation"].isin(["abs_max", "none"])]
    loss_nodes = [n for n in rows["node"].unique() if facts.is_loss_like(n)]  # asked once per node, not per row
    rows = rows[~(rows["node"].isin(loss_nodes) | (rows["tensor_type"] == "loss"))]
    rows = rows[np.isfinite(rows["abs_mean"]) & (rows["abs_mean"] > 0)]
    if not len(rows):
        return None
    rows = rows.assign(log=np.log10(rows["abs_mean"].astype(np.float64)),
                       learned=rows["tensor_type"] != "parameter")
    return rows.groupby(["kind", "training_step", "node", "role", "learned"], sort=False,
                        observed=True)["log"].max().reset_index()


def gradients_from_levels(data: TrialData, facts: GraphFacts, options: ScanOptions,
                          per_node: pd.DataFrame) -> list[Finding]:
    """Judge each node's gradient against its step's: below the largest learned one (vanishing), above the median
    (exploding). Per kind, one dense array of steps x (node, role): a few bytes per node and step, where
    pandas' joins on the long table took several copies of it."""
    findings = []
    vanishing, exploding = options.orders(options.vanishing_orders), options.orders(options.exploding_orders)
    for kind, rows in per_node.groupby("kind", sort=False, observed=True):
        steps, at_step = np.unique(rows["training_step"].to_numpy(np.int64), return_inverse=True)
        nodes, roles = pd.Categorical(rows["node"]), pd.Categorical(rows["role"])
        # One column per (node, role), in the order the series first appear.
        column = pd.factorize(nodes.codes.astype(np.int64) * len(roles.categories) + roles.codes)[0]
        first_row = np.unique(column, return_index=True)[1]
        logs = np.full((len(steps), len(first_row)), np.nan)
        logs[at_step, column] = rows["log"].to_numpy(np.float64)
        learned = rows["learned"].to_numpy(bool)[first_row]
        present = ~np.isnan(logs)
        reference = np.where(present & learned, logs, -np.inf).max(axis=1)
        reference = np.where(np.isfinite(reference), reference, np.where(present, logs, -np.inf).max(axis=1))
        median = np.nanmedian(logs, axis=1)  # every step has the value of some node: never an empty row
        below, above = reference[:, None] - logs, logs - median[:, None]
        node_names, role_names = nodes[first_row], roles[first_row]
        for index in range(len(first_row)):
            node, role = str(node_names[index]), str(role_names[index])
            if facts.role.get(node) in ("input", "target"):
                continue  # the gradient of an input says how much the loss depends on it: small is fine
            recorded = int(present[:, index].sum())
            for name, distance, limit, word in (("vanishing_gradient", below, vanishing, "below the largest"),
                                                ("exploding_gradient", above, exploding, "above the median")):
                flagged = distance[:, index] > limit
                if int(flagged.sum()) * 2 < recorded or not flagged.any():
                    continue
                orders = float(np.median(distance[flagged, index]))
                flagged_steps = [int(s) for s in steps[flagged]]
                typical = 10 ** float(np.median(logs[flagged, index]))
                findings.append(Finding(
                    detector=name, severity="warning",
                    score=min(1.0, int(flagged.sum()) / recorded * orders / (2 * limit)),
                    trial=data.trial, node=node, role=role, kind=str(kind), training_step=flagged_steps[0],
                    steps=flagged_steps, iteration=_iteration_of(data, node, str(kind), flagged_steps[0]),
                    message=f"The gradient of {node} ({role}) is {orders:.1f} orders of magnitude {word} gradient of "
                            f"its step in {int(flagged.sum())} of {recorded} recorded steps "
                            f"(typically {typical:.2e}).",
                    evidence={"orders_of_magnitude": orders, "steps_flagged": int(flagged.sum()), "steps": recorded,
                              "median_gradient": typical,
                              "reference_gradient": 10 ** float(np.median(reference[flagged]))},
                    aggregation="none" if role in _unbatched(data, node) else "abs_max", statistic="abs_mean",
                    column=facts.column.get(node, 0)))
    return findings


def growth(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """A tensor, parameter or gradient whose largest value grows by orders of magnitude over training."""
    candidates, ends = growth_candidates(data, facts, options)
    return growth_beyond_typical(candidates, ends)


def growth_beyond_typical(candidates: list[tuple[str, float, Finding]], ends: pd.DataFrame) -> list[Finding]:
    """The candidates that end well above what the tensors of their kind typically reach by the end:
    growth from tiny to typical (a gradient that starts near zero, an output layer initialised at zero)
    is learning, not growth without bound."""
    typical = ends.groupby("kind", observed=True)["abs_max"].median() if len(ends) else pd.Series(dtype=float)
    return [f for kind, late, f in candidates if late >= STANDS_OUT * float(typical.get(kind, 0.0))]


def growth_candidates(data: TrialData, facts: GraphFacts,
                      options: ScanOptions) -> tuple[list[tuple[str, float, Finding]], pd.DataFrame]:
    """Series that grow by orders of magnitude (kind, last quarter, finding), and every series' value at its
    last step (kind, abs_max): a streamed scan gathers both over its node groups before it judges."""
    return growth_candidates_from(data, facts, options, growth_steps(data))


def growth_steps(data: TrialData) -> pd.DataFrame:
    """Per kind, node, role and step: the median of the largest value over the step's rows."""
    stats = data.stats
    rows = stats[stats["aggregation"].isin(["mean", "none"]) & np.isfinite(stats["abs_max"])]
    rows = rows[~rows["tensor_type"].isin(NOT_LEARNED)]
    per_step = rows.groupby(["kind", "node", "role", "training_step"], sort=True,
                            observed=True)["abs_max"].median().reset_index()
    return per_step.assign(**{name: as_text(per_step[name]) for name in ("kind", "node", "role")})


def growth_candidates_from(data: TrialData, facts: GraphFacts, options: ScanOptions,
                           per_step: pd.DataFrame) -> tuple[list[tuple[str, float, Finding]], pd.DataFrame]:
    per_step = per_step.sort_values(["kind", "node", "role", "training_step"], kind="stable", ignore_index=True)
    candidates = []
    limit = options.orders(options.growth_orders)
    last_steps = per_step.groupby(["kind", "node", "role"], observed=True)["training_step"].transform("max")
    ends = per_step.loc[per_step["training_step"] == last_steps, ["kind", "abs_max"]]
    ends = ends.assign(kind=as_text(ends["kind"]))
    for (kind, node, role), series in per_step.groupby(["kind", "node", "role"], sort=False, observed=True):
        values = series["abs_max"].to_numpy(np.float64)
        early, late = _quarters(values, options)
        if early is None or late is None or early <= 0 or not np.isfinite(late) or late <= 0:
            continue
        orders = float(np.log10(late / early))
        trend = _monotone(series["training_step"].to_numpy(), values)
        if orders < limit or trend < 0.8:
            continue
        gradient = kind != fmt.FORWARD
        candidates.append((str(kind), late, Finding(
            detector="exploding_gradient" if gradient else "growth", severity="warning",
            score=min(1.0, orders / (2 * limit)) * trend, trial=data.trial, node=node, role=role, kind=kind,
            training_step=int(series["training_step"].iloc[-1]), steps=series["training_step"].tolist(),
            iteration=_iteration_of(data, node, kind, int(series["training_step"].iloc[-1])),
            message=f"The largest {'gradient' if gradient else 'value'} of {node} ({role}) grows {orders:.1f} orders "
                    f"of magnitude over training ({early:.3g} in the first quarter of the recorded steps, "
                    f"{late:.3g} in the last) and keeps growing (Spearman {trend:.2f} with the step).",
            evidence={"first_quarter": early, "last_quarter": late, "orders_of_magnitude": orders,
                      "spearman_with_step": trend, "steps": len(values)},
            aggregation="none" if role in _unbatched(data, node) else "mean", statistic="abs_max",
            column=facts.column.get(node, 0))))
    return candidates, ends


# The least spread over the batch, in the first quarter of training, that can collapse: below it the
# samples were alike from the start (e.g. a layer fed by dead units: its bias, plus rounding noise).
COLLAPSE_MIN_SPREAD = 1e-6


def collapse(data: TrialData, facts: GraphFacts, options: ScanOptions) -> list[Finding]:
    """The spread over the batch shrinking towards zero: every sample gets the same value."""
    return collapse_judged(data, facts, options, collapse_steps(data))


def collapse_steps(data: TrialData) -> pd.DataFrame:
    """Per node, role and step: the median over the step's rows of the batch spread averaged over units."""
    spread = data.neurons["std"]
    keys = spread.keys
    parts = []
    for (node, role), group in keys.groupby(["node", "role"], sort=False, observed=True):
        matrix = spread.matrix(group.index.to_numpy())
        per_row = pd.Series(matrix.mean(axis=1), index=group.index)
        per_step = per_row.groupby(group["training_step"]).median().sort_index()
        parts.append(pd.DataFrame({"node": str(node), "role": str(role), "tensor_type": str(group["tensor_type"].iloc[0]),
                                   "training_step": per_step.index.to_numpy(np.int64),
                                   "spread": per_step.to_numpy(np.float64)}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        {"node": [], "role": [], "tensor_type": [], "training_step": [], "spread": []})


def collapse_judged(data: TrialData, facts: GraphFacts, options: ScanOptions,
                    steps: pd.DataFrame) -> list[Finding]:
    findings = []
    limit = options.orders(options.collapse_orders)
    for (node, role), group in steps.groupby(["node", "role"], sort=False):
        if group["tensor_type"].iloc[0] in NOT_LEARNED or facts.is_loss_like(node):
            continue
        per_step = group.set_index("training_step")["spread"].sort_index()
        values = per_step.to_numpy(np.float64)
        early, late = _quarters(values, options)
        if early is None or late is None or early <= COLLAPSE_MIN_SPREAD or not np.isfinite(late):
            continue  # a spread at the level of float32 rounding from the start has nothing to collapse from
        orders = float(np.log10(early / max(late, 1e-30)))
        if orders < limit:
            continue
        findings.append(Finding(
            detector="collapse", severity="warning", score=min(1.0, orders / (2 * limit)), trial=data.trial,
            node=node, role=role, kind=fmt.FORWARD, training_step=int(per_step.index[-1]),
            steps=[int(s) for s in per_step.index], iteration=_iteration_of(data, node, fmt.FORWARD,
                                                                             int(per_step.index[-1])),
            message=f"The spread of {node} ({role}) over the batch collapses: its standard deviation falls "
                    f"{orders:.1f} orders of magnitude ({early:.3g} in the first quarter, {late:.3g} in the last), "
                    "so every sample gets nearly the same value.",
            evidence={"first_quarter_std": early, "last_quarter_std": late, "orders_of_magnitude": orders},
            aggregation="std", statistic="abs_mean", column=facts.column.get(node, 0)))
    return findings


def _quarters(values: np.ndarray, options: ScanOptions) -> tuple[float | None, float | None]:
    if len(values) < max(4, options.min_steps):
        return None, None
    quarter = max(1, len(values) // 4)
    return float(np.median(values[:quarter])), float(np.median(values[-quarter:]))


def _monotone(steps: np.ndarray, values: np.ndarray) -> float:
    if len(set(values.tolist())) < 2:
        return 0.0
    rho = scipy_stats.spearmanr(steps, values).statistic
    return float(rho) if np.isfinite(rho) else 0.0


def _unbatched(data: TrialData, node: str) -> set[str]:
    if data.locator is not None:
        return data.locator.unbatched(node)
    rows = data.stats[(data.stats["node"] == node) & (data.stats["aggregation"] == "none")]
    return set(rows["role"].unique())


def _iteration_of(data: TrialData, node: str, kind: str, step: int) -> int:
    """An iteration of ``step`` in which the node's values can be opened."""
    if data.locator is not None:
        return data.locator.iteration_of(data, node, step)
    rows = data.stats[(data.stats["node"] == node) & (data.stats["training_step"] == step)]
    iterations = rows["iteration"].astype(int)
    if len(iterations) and iterations.max() >= 0:
        return int(iterations[iterations >= 0].min())
    step_iterations = data.steps.loc[data.steps["training_step"] == step, "iteration"]
    return int(step_iterations.min()) if len(step_iterations) else 0

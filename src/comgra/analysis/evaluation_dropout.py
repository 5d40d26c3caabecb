"""Dropout that stays on in evaluation without a dropout module: ``F.dropout(x, p)`` in a forward (its ``training``
argument defaults to True) or ``F.dropout(x, p, training=True)``, so ``model.eval()`` does not switch it off.

The evidence is a recorded tensor and the recorded tensor it is computed from with no parameter in between, both
of the same shape on the same steps (so value i of one comes from value i of the other: a pooled, reshaped or
sliced tensor is not compared with its source). On evaluation
steps, a fraction of the output's values are exactly zero where the input was positive. An activation maps a
positive input to a non-zero value (ReLU, GELU, tanh, sigmoid: their zeros lie where the input was zero or
negative), a dropout switched off is the identity, and zeros of sparse inputs are zeros of the input too; only
something that drops values at random zeroes positive ones. Two further checks keep structured zeroing out: the
values that pass keep the input's sign (the two tensors are aligned value by value), and whole samples are not
zeroed (a padding or attention mask zeroes whole positions; dropout zeroes values one by one), and the zeroed
values are not only the small ones (dropout does not look at a value; a threshold, shrinkage or top-k does).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from comgra.analysis import evidence_tables as tables
from comgra.analysis.findings import Finding
from comgra.analysis.graphs import GraphFacts
from comgra.analysis.loading import TrialData
from comgra.analysis.trends import NOT_LEARNED, _iteration_of
from comgra.store import format as fmt

MIN_DROPPED = 0.05  # of the positive input values exactly zero in the output on evaluation steps
MIN_POSITIVE = 32  # positive input values on evaluation steps, to judge the fraction at all
MIN_SIGN_AGREEMENT = 0.95  # values non-zero in both that keep their sign: the tensors are aligned value by value
MAX_WHOLE_ROWS = 0.2  # of the samples whose positive values are all zeroed: more is a mask, not dropout
MAX_LISTED = 8  # tensors named in the message
MIN_LARGE_DROPPED = 0.2  # of the zeroed values whose input was above the median positive input (dropout: half)
ROW_KEYS = ["rank", "training_step", "iteration", "sample"]


def detect(data: TrialData, facts: GraphFacts, skip: set[str]) -> list[Finding]:
    """Findings of problem ``functional_dropout_in_evaluation``; ``skip``: nodes a finding on a dropout module in
    training mode already covers."""
    known = tables.phases(data)
    if tables.EVALUATION not in known.values() or "sample" not in data.neurons:
        return []
    rows = data.neurons["sample"]
    keys = rows.keys
    if not len(keys):
        return []
    phase = tables.phase_of(known, keys)
    keys = keys.assign(phase=phase, position=np.arange(len(keys)))
    by_node = {str(node): group for node, group in keys.groupby("node", sort=True, observed=True)
               if str(group["tensor_type"].iloc[0]) not in NOT_LEARNED}
    shapes = _shapes(data)
    found = []
    for source in sorted(by_node):
        for node in sorted(facts.feeds.get(source, ())):
            if node not in by_node or node in facts.learned or node in skip or facts.is_loss_like(node):
                continue
            if source in shapes and node in shapes and shapes[source] != shapes[node]:
                continue  # a pooling, reshape or slice between them: value i of one is not value i of the other
            judged = _judge(rows, by_node[source], by_node[node], source, node)
            if judged is not None:
                found.append(judged)
    return [_finding(data, facts, found, by_node)] if found else []


def _shapes(data: TrialData) -> dict[str, set[tuple[int, ...]]]:
    """The shapes each tensor had on its recorded steps (none known in a streamed scan: the values judge alone)."""
    frame = data.shapes
    if not len(frame):
        return {}
    return {str(node): {tuple(shape) for shape in group["shape"]}
            for node, group in frame.groupby("node", sort=False, observed=True)}


def _pairs(rows, source: pd.DataFrame, node: pd.DataFrame, phase: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The aligned per-sample values of ``source`` and ``node`` on steps of ``phase``."""
    both = source[source["phase"] == phase].merge(node[node["phase"] == phase], on=ROW_KEYS, suffixes=("_in", "_out"))
    if not len(both):
        return np.zeros((0, 0)), np.zeros((0, 0)), []
    inputs = rows.matrix(both["position_in"].to_numpy())
    outputs = rows.matrix(both["position_out"].to_numpy())
    return inputs, outputs, sorted({int(s) for s in both["training_step"]})


def _dropped(inputs: np.ndarray, outputs: np.ndarray) -> tuple[float, int] | None:
    """(fraction of positive inputs zeroed, how many positive inputs), or None where the evidence is not dropout's."""
    if inputs.shape != outputs.shape or inputs.shape[1] < 8 or not (np.isfinite(inputs).all()
                                                                      and np.isfinite(outputs).all()):
        return None
    positive = inputs > 0
    if positive.sum() < MIN_POSITIVE:
        return None
    passed = (outputs != 0) & (inputs != 0)
    if passed.sum() < MIN_POSITIVE or (np.sign(outputs[passed]) == np.sign(inputs[passed])).mean() < MIN_SIGN_AGREEMENT:
        return None
    zeroed = positive & (outputs == 0)
    rows_with_positive = positive.sum(axis=1) >= 2
    whole = (zeroed.sum(axis=1) == positive.sum(axis=1))[rows_with_positive]
    if len(whole) and whole.mean() > MAX_WHOLE_ROWS:
        return None
    if zeroed.any() and (inputs[zeroed] > np.median(inputs[positive])).mean() < MIN_LARGE_DROPPED:
        return None  # the small values are zeroed: a threshold, shrinkage or top-k keeps the large ones
    return float(zeroed.sum() / positive.sum()), int(positive.sum())


def _judge(rows, source: pd.DataFrame, node: pd.DataFrame, source_name: str, name: str) -> dict[str, Any] | None:
    inputs, outputs, steps = _pairs(rows, source, node, tables.EVALUATION)
    judged = _dropped(inputs, outputs) if steps else None
    if judged is None or judged[0] < MIN_DROPPED or judged[0] > 1 - MIN_DROPPED:
        return None
    train_in, train_out, train_steps = _pairs(rows, source, node, tables.TRAINING)
    training = _dropped(train_in, train_out) if train_steps else None
    return {"node": name, "input": source_name, "zero_fraction": judged[0], "positive_inputs": judged[1],
            "training_zero_fraction": None if training is None else training[0], "steps": steps}


def _finding(data: TrialData, facts: GraphFacts, found: list[dict[str, Any]], by_node: dict[str, pd.DataFrame]
             ) -> Finding:
    """One finding for the cause, on the earliest tensor that shows it, listing every tensor that does."""
    found = sorted(found, key=lambda f: (facts.column.get(f["node"], 0), f["node"]))
    first = found[0]
    name, steps, training = first["node"], first["steps"], first["training_zero_fraction"]
    also = (f" Training steps show the same ({training:.0%})." if training is not None and training >= MIN_DROPPED
            else "")
    others = [f["node"] for f in found[1:]]
    more = (f" {len(others)} more tensor(s) show it too: {', '.join(others[:MAX_LISTED])}"
            f"{' and more' if len(others) > MAX_LISTED else ''}." if others else "")
    return Finding(
        detector="run_modes", severity="error", score=0.9, trial=data.trial, node=name,
        role=str(by_node[name]["role"].iloc[0]), kind=fmt.FORWARD, training_step=steps[0], steps=steps,
        iteration=_iteration_of(data, name, fmt.FORWARD, steps[0]),
        message=f"On evaluation steps ({_listed(steps)}), {first['zero_fraction']:.0%} of the values of {name} are "
                f"exactly zero where its input {first['input']} was positive ({first['positive_inputs']} values): "
                f"dropout is applied while evaluating, though no dropout module is in training mode.{also}{more} A "
                "functional dropout, F.dropout(x, p), whose training argument defaults to True, stays on after "
                "model.eval(): pass training=self.training (or use an nn.Dropout module).",
        evidence={"problem": "functional_dropout_in_evaluation", "zero_fraction": first["zero_fraction"],
                  "input": first["input"], "positive_inputs": first["positive_inputs"],
                  "training_zero_fraction": training, "nodes": [f["node"] for f in found],
                  "node_count": len(found)},
        aggregation="sample:0", statistic="abs_mean", column=facts.column.get(name, 0))


def _listed(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:5])) + (f", ... ({len(steps)} steps)" if len(steps) > 5 else "")

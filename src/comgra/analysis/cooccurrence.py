"""Which findings tend to occur together: the same steps flagged by two findings of a trial.

Outliers at the same steps in two nodes, a vanishing gradient in the steps where another node
explodes: a pair whose flagged steps overlap (Jaccard index) more than chance would give is
reported once, on the node earlier in the graph.
"""
from __future__ import annotations

from itertools import combinations

from comgra.analysis.findings import Finding

MIN_SHARED_STEPS = 3
MIN_JACCARD = 0.5
MAX_PAIRS = 5
# Findings whose steps are every recorded step say nothing about "together".
STEP_DETECTORS = ("outlier", "vanishing_gradient", "exploding_gradient", "non_finite")


def detect(findings: list[Finding], recorded_steps: int) -> list[Finding]:
    candidates = [f for f in findings if f.detector in STEP_DETECTORS and f.origin
                  and MIN_SHARED_STEPS <= len(f.steps) < max(recorded_steps // 2, MIN_SHARED_STEPS + 1)]
    pairs = []
    for first, second in combinations(candidates, 2):
        if (first.node, first.role) == (second.node, second.role):
            continue
        shared = set(first.steps) & set(second.steps)
        jaccard = len(shared) / len(set(first.steps) | set(second.steps))
        if len(shared) >= MIN_SHARED_STEPS and jaccard >= MIN_JACCARD:
            pairs.append((jaccard, first, second, sorted(shared)))
    pairs.sort(key=lambda pair: -pair[0])
    return [_finding(jaccard, first, second, shared) for jaccard, first, second, shared in pairs[:MAX_PAIRS]]


def _finding(jaccard: float, first: Finding, second: Finding, shared: list[int]) -> Finding:
    early, late = sorted((first, second), key=lambda f: (f.column, f.node))
    return Finding(
        detector="co_occurrence", severity="info", score=jaccard * 0.5, trial=early.trial, node=early.node,
        role=early.role, kind=early.kind, training_step=shared[0], steps=shared, iteration=early.iteration,
        message=f"{early.detector} at {early.node} and {late.detector} at {late.node} occur together: "
                f"{len(shared)} shared steps (Jaccard {jaccard:.2f}).",
        evidence={"first": f"{early.detector}@{early.node}", "second": f"{late.detector}@{late.node}",
                  "shared_steps": len(shared), "jaccard": jaccard},
        aggregation=early.aggregation, statistic=early.statistic, column=early.column)

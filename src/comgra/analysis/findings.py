"""What a detector reports: a ``Finding``, how findings are ranked, and their JSON form.

A finding names the node where a problem shows first and the app selection that shows the
evidence, so that a user knows where to look before looking.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from comgra.store.reader import TrialReader

FORMAT_VERSION = 1
# A finding lists at most this many of the steps it was seen in, evenly spaced over them (the first and the
# last included; its evidence gives their number): a finding seen on every step of a long run would otherwise
# carry every step, and a few hundred such findings take hundreds of megabytes in a scan and in its JSON.
MAX_LISTED_STEPS = 200
SEVERITIES = ("error", "warning", "info")
_SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class ScanOptions:
    """Thresholds of the detectors. ``sensitivity`` > 1 finds more (thresholds are divided by it).

    >>> ScanOptions(sensitivity=2.0).scaled(0.4)
    0.2
    """

    sensitivity: float = 1.0
    target: str | None = None  # the per-sample tensor that correlation hints explain; None: a loss-like one
    vanishing_orders: float = 4.0  # a gradient this many powers of ten below the largest of its step
    exploding_orders: float = 4.0
    growth_orders: float = 3.0  # a statistic that grows this many powers of ten from the first to the last quarter
    collapse_orders: float = 3.0
    dead_fraction: float = 0.4  # warning above; info above a quarter of it
    saturated_fraction: float = 0.5
    saturation_margin: float = 0.02
    one_sided_ratio: float = 0.05  # the small side below this fraction of the large one
    update_ratio_high: float = 0.1  # relative change of a parameter per training step
    update_ratio_low: float = 1e-8
    outlier_z: float = 10.0  # robust z-score (median/MAD) of a detrended statistic
    outlier_iqr: float = 3.0
    correlation_min_rho: float = 0.3
    correlation_alpha: float = 0.01  # after the Benjamini-Hochberg correction over every feature tried
    correlation_max_hints: int = 8
    min_steps: int = 3  # fewer recorded steps: no statement about a trend

    def scaled(self, threshold: float) -> float:
        """A threshold of 'how bad', lowered when the user asks for more findings."""
        return threshold / self.sensitivity

    def orders(self, orders: float) -> float:
        return orders / self.sensitivity


@dataclass
class Finding:
    """One problem or hint, with the numbers behind it and the selection that shows it."""

    detector: str
    severity: str  # error, warning, info
    score: float  # confidence in [0, 1]
    trial: str
    node: str
    role: str | None
    kind: str | None  # "forward" or the gradient group
    training_step: int | None  # the first step where it shows
    message: str
    steps: list[int] = field(default_factory=list)
    iteration: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    aggregation: str | None = None  # of the selection that shows it
    statistic: str = "mean"  # the statistic to plot across steps
    origin: bool = True  # False for a node a problem spread to
    column: int = 0  # how early in the graph the node is (for ranking)

    def __post_init__(self) -> None:
        self.steps = listed_steps(self.steps)

    @property
    def selection(self) -> dict[str, Any]:
        return {"trial": self.trial, "training_step": self.training_step, "iteration": self.iteration,
                "node_id": self.node, "role": self.role, "kind": self.kind, "aggregation": self.aggregation}

    def to_json(self, link: str | None = None) -> dict[str, Any]:
        """The JSON form; ``link`` is the app's link to the selection (the service builds it: analysis
        sits below the service and does not know the app's URLs)."""
        document = asdict(self)
        document.pop("column")
        document["steps"] = [int(s) for s in self.steps]
        document["selection"] = self.selection
        document["link"] = link
        return _plain(document)


def listed_steps(steps: list[int]) -> list[int]:
    """``steps``, or ``MAX_LISTED_STEPS`` of them evenly spaced, the first and the last included."""
    if len(steps) <= MAX_LISTED_STEPS:
        return steps
    last = len(steps) - 1
    return [steps[round(i * last / (MAX_LISTED_STEPS - 1))] for i in range(MAX_LISTED_STEPS)]


def signature_files(trial: TrialReader) -> list[Path]:
    """The chunks a trial's findings are computed from: its visible tensors chunks, then its steps, runinfo and
    sentinels chunks."""
    return list(trial.tensor_chunks()) + [p for table in ("steps", "runinfo", "sentinels") for p in trial.chunk_paths(table)]


def trial_signature(trial: TrialReader) -> tuple[str, ...]:
    """The version of a trial's data: the names of its tensors and steps chunks (chunks are immutable,
    so a trial whose names did not change has the same findings)."""
    return tuple(p.name for p in signature_files(trial))


# The evidence that says how strong a finding is, beyond its (capped) score: findings of equal score are ordered
# by it, so that a tie is decided by the data, never by the nodes' names.
STRENGTH_KEYS = ("orders_of_magnitude", "dead_fraction", "saturated_fraction", "zero_fraction", "growth_factor",
                 "robust_z", "ratio", "steps_flagged")


def strength(finding: Finding) -> float:
    """The first of ``STRENGTH_KEYS`` the finding's evidence has (0 without one)."""
    for key in STRENGTH_KEYS:
        value = finding.evidence.get(key)
        if isinstance(value, (int, float)) and value == value:
            return float(value)
    return 0.0


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Most useful first: severity, an origin before the nodes it spread to, confidence, then how early in training
    the problem starts (a cause shows before its consequences), the strength of the evidence and how early in the
    graph; the names only last, for a total order."""
    return sorted(findings, key=lambda f: (
        _SEVERITY_RANK.get(f.severity, len(SEVERITIES)), not f.origin, -round(f.score, 3),
        f.training_step if f.training_step is not None else 0, -round(strength(f), 3), f.column, f.trial, f.node,
        f.detector))


def document(findings: list[Finding], problems: list[str] | None = None,
             link: Callable[[Finding], str] | None = None) -> dict[str, Any]:
    """The versioned JSON document of ``comgra scan --json``."""
    return {"format_version": FORMAT_VERSION,
            "findings": [f.to_json(link(f) if link else None) for f in findings],
            "skipped_chunks": list(problems or [])}


def _plain(value: Any) -> Any:
    """numpy scalars and tuples turned into JSON types; non-finite floats into strings JSON can hold."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return value


# The detectors whose findings are a property of one tensor among many alike (not an event of a step, a curve, a
# pair of ranks, nor a detector whose one name covers several causes): folded into one summary when they repeat.
PER_TENSOR = frozenset({
    "parameter_frozen", "parameter_not_updated", "parameter_stopped", "parameter_shrinking",
    "parameter_changes_without_gradient", "update_ratio", "vanishing_gradient", "exploding_gradient", "growth",
    "collapse", "dead_units", "saturated_units", "one_sided", "identical_units", "sparse_units", "growth_along_edge",
    "accidental_detach"})
SUMMARY_MIN = 3  # this many findings of one detector and severity in a trial become one that lists them
MAX_MEMBERS = 1000  # listed in a summary's evidence (the count says how many there are)


def summarised(findings: list[Finding]) -> list[Finding]:
    """One finding per cause: the findings of one detector and severity on ``SUMMARY_MIN`` or more tensors of a
    trial (a frozen base of hundreds of tensors, a dozen LayerNorm weights rounded away in bf16) become one, at the
    place of the first of them (``findings`` ranked first), that names their module and lists them in its
    evidence (``members``: node, first step, the statistic's selection), expandable in the app."""
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for finding in findings:
        if finding.detector in PER_TENSOR and not finding.evidence.get("members"):
            groups.setdefault((finding.trial, finding.detector, finding.severity), []).append(finding)
    folded = {id(f) for group in groups.values() if len(group) >= SUMMARY_MIN for f in group}
    result = []
    for finding in findings:
        if id(finding) not in folded:
            result.append(finding)
            continue
        group = groups[(finding.trial, finding.detector, finding.severity)]
        if group[0] is finding:
            result.append(_summary(group))
    return result


def _summary(group: list[Finding]) -> Finding:
    first = group[0]
    nodes = [f.node for f in group]
    module = _common_module(nodes)
    where = f"of {module}" if module else "across the model"
    listed = ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")
    members = [{"node": f.node, "role": f.role, "training_step": f.training_step,
                "score": round(f.score, 3)} for f in group[:MAX_MEMBERS]]
    return Finding(
        detector=first.detector, severity=first.severity, score=max(f.score for f in group), trial=first.trial,
        node=first.node, role=first.role, kind=first.kind, training_step=first.training_step,
        message=f"{len(group)} tensors {where} ({listed}), one cause. The first: {first.message}",
        steps=list(first.steps), iteration=first.iteration,
        evidence={**first.evidence, "count": len(group), "module": module, "members": members},
        aggregation=first.aggregation, statistic=first.statistic, origin=any(f.origin for f in group),
        column=min(f.column for f in group))


def _common_module(nodes: list[str]) -> str:
    """The longest dotted prefix the nodes share ('' where they share none)."""
    parts = [n.split(".") for n in nodes]
    shared = []
    for pieces in zip(*parts):
        if len(set(pieces)) != 1:
            break
        shared.append(pieces[0])
    common = ".".join(shared)
    return common if common not in nodes else ".".join(shared[:-1])

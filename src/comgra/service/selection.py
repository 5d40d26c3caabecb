"""What a view is: the selection the user asked for, its URL state, and the value types of an answer.

A view link (``/?tab=...&trial=...&step=...``) is what the browser keeps and what findings and the REST
API hand out (:func:`view_link`, :func:`wanted_from_query`). What the browser sent can be any JSON
(:func:`clean_wanted` keeps the values of the right type); ``resolve.py`` turns it into a
:class:`Selection` that exists. No torch, no Dash, no reads.

    >>> view_link("trial_a", training_step=40, node_id="out")
    '/?tab=tensors&trial=trial_a&step=40&node=out'
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode

import numpy as np

from comgra.store import format as fmt

# The "every type of training step" filter. The recorder refuses types that start with "__", so no user's
# type can be this value (a plain "any" was one: a type named "any" could not be selected on its own).
ANY_TYPE = "__any__"
BATCH_AGGREGATIONS = ("mean", "std", "abs_max")
AGGREGATION_LABELS = {
    "mean": "Mean over the batch",
    "std": "STD over the batch",
    "abs_max": "Max abs over the batch",
    "none": "No batch dimension",
}
PLOT_STATISTICS = fmt.STATISTICS + ("svd_max",)


def aggregation_value(aggregation: str, sample: int) -> str:
    """The one-string form of (aggregation, sample) used by selectors: "mean", "sample:3", ..."""
    return f"sample:{sample}" if aggregation == "sample" else aggregation


def parse_aggregation(value: str) -> tuple[str, int]:
    """("sample", k) for "sample:k", else (value, -1); a malformed sample index is -1, never an exception."""
    if isinstance(value, str) and value.startswith("sample:"):
        index = value.split(":", 1)[1]
        return "sample", int(index) if index.isdigit() and len(index) < 10 else -1
    return value, -1


def aggregation_label(value: str, category: str | None = None) -> str:
    aggregation, sample = parse_aggregation(value)
    if aggregation != "sample":
        return AGGREGATION_LABELS.get(aggregation, aggregation)
    return f"Sample {sample} ({category})" if category else f"Sample {sample}"


# The query-string keys of a view's link, in order, and the ``wanted`` key each one sets. The app
# reads them at page load and writes them on every change; findings and the REST API build links with
# :func:`view_link`, so a link is the same whoever makes it.
URL_KEYS = {
    "tab": "tab", "trial": "trial", "type": "type_of_execution", "step": "training_step",
    "iteration": "iteration", "node": "node_id", "role": "role", "kind": "kind",
    "aggregation": "aggregation", "rank": "rank",
    "stat": "statistic",  # not part of the selection: the statistic the Tensors view plots across steps
}


def view_link(trial: str, *, tab: str = "tensors", type_of_execution: str | None = None,
              training_step: int | None = None, iteration: int | None = None, node_id: str | None = None,
              role: str | None = None, kind: str | None = None, aggregation: str | None = None,
              rank: int | None = None, statistic: str | None = None) -> str:
    """The app's relative link (``/?tab=...&trial=...``) that opens this view; None fields are left out.
    ``statistic`` (``stat=``) is the one the Tensors view plots across steps.

    >>> view_link("trial_a", training_step=40, node_id="out", aggregation="sample:3")
    '/?tab=tensors&trial=trial_a&step=40&node=out&aggregation=sample%3A3'
    """
    values = {"tab": tab, "trial": trial, "type": type_of_execution, "step": training_step,
              "iteration": iteration, "node": node_id, "role": role, "kind": kind,
              "aggregation": aggregation, "rank": rank, "stat": statistic}
    return "/?" + urlencode({key: value for key, value in values.items() if value is not None})


def wanted_from_query(query: str | Mapping[str, Any]) -> dict[str, Any]:
    """The ``wanted`` of :meth:`RecordingService.resolve` that a view link asks for (see :func:`view_link`).

    Unknown keys and malformed numbers are dropped (they then mean "the default"); a role
    applies to the node the link names.

    >>> wanted_from_query("?tab=tensors&trial=t&step=40&node=out&role=out&aggregation=sample%3A3")
    {'trial': 't', 'training_step': 40, 'node_id': 'out', 'aggregation': 'sample:3', 'roles': {'out': 'out'}}
    """
    if isinstance(query, str):
        query = {k: v[-1] for k, v in parse_qs(query.lstrip("?")).items()}
    wanted: dict[str, Any] = {}
    for key, field_ in URL_KEYS.items():
        value = query.get(key)
        if not isinstance(value, str) or key in ("tab", "role", "stat"):
            continue
        if field_ in _WANTED_INT:
            if value.lstrip("-").isdigit() and len(value) < 19:
                wanted[field_] = int(value)
        else:
            wanted[field_] = value
    role = query.get("role")
    if isinstance(role, str) and "node_id" in wanted:
        wanted["roles"] = {wanted["node_id"].split("*", 1)[0]: role}
    return wanted


class Notice(str):
    """A message for the user; ``about`` names the selector it concerns, so the app shows it beside that one.

    ``about`` is one of NOTICE_TOPICS; a plain ``str`` in ``View.notices`` counts as "general".
    """

    about: str

    def __new__(cls, text: str, about: str = "general") -> Notice:
        notice = super().__new__(cls, text)
        notice.about = about
        return notice


NOTICE_TOPICS = ("general", "trial", "rank", "type", "step", "iteration", "node", "role", "kind", "aggregation")


@dataclass(frozen=True)
class Selection:
    """A selection that exists in the recording: every field is valid for the others."""

    trial: str
    type_of_execution: str  # the filter: ANY_TYPE or one type of training step
    training_step: int
    step_type: str  # the type of the selected step
    iteration: int
    node_id: str  # id in the graph; differs from node for a tensor of an earlier iteration
    node: str
    data_iteration: int  # the iteration under which the node's values are stored
    role: str
    kind: str
    aggregation: str  # "mean", "std", "abs_max", "none" or "sample:<k>"
    rank: int = 0  # the torch.distributed rank whose values are shown

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Choices:
    """The valid values of every selector around a selection."""

    trials: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    step_types: list[str] = field(default_factory=list)  # the type of each of ``steps`` (a number may repeat)
    iterations: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    aggregations: list[tuple[str, str]] = field(default_factory=list)  # (value, label)
    ranks: list[int] = field(default_factory=list)  # the ranks of a torch.distributed run; [0] for one process


@dataclass
class View:
    """Everything the tensors page shows; ``selection`` is None when nothing can be shown."""

    selection: Selection | None = None
    trial: str | None = None  # the trial shown, also when it has nothing to select
    choices: Choices = field(default_factory=Choices)
    graph: fmt.GraphDocument | None = None
    row: dict[str, Any] | None = None
    notices: list[str] = field(default_factory=list)
    banners: list[str] = field(default_factory=list)
    node_fallback: bool = False  # the wanted node does not exist here; another one is shown


@dataclass(frozen=True)
class Series:
    trial: str
    steps: np.ndarray
    values: np.ndarray
    rank: int | None = None  # set when the lines of several ranks are drawn side by side


# -- what the browser sent: any JSON at all ------------------------------------------------------------
_WANTED_TEXT = ("trial", "type_of_execution", "step_type", "node_id", "kind", "aggregation")
_WANTED_INT = ("training_step", "iteration", "rank")
_INT_LIMIT = 2**62  # beyond any step or iteration; keeps numpy's int64 arithmetic exact


def clean_wanted(wanted: Any, view: View | None = None) -> dict[str, Any]:
    """``wanted`` with every value of the wrong type dropped (it then means "the default").

    The browser holds the selection state, so it can send anything: a string step, an
    integer of 400 digits, a list for a node. Those are wishes that cannot be met,
    not errors: ``view`` gets one notice that lists the keys that were ignored.
    """
    if not isinstance(wanted, Mapping):
        return {}
    known = (*_WANTED_TEXT, *_WANTED_INT, "roles")
    clean: dict[str, Any] = {k: v for k, v in wanted.items() if isinstance(k, str) and k not in known}
    for key in _WANTED_TEXT:
        if isinstance(wanted.get(key), str):
            clean[key] = wanted[key]
    for key in _WANTED_INT:
        value = wanted.get(key)
        if type(value) is int and abs(value) < _INT_LIMIT:  # noqa: E721 - True is no step
            clean[key] = value
    roles = wanted.get("roles")
    if isinstance(roles, Mapping):
        clean["roles"] = {k: v for k, v in roles.items() if isinstance(k, str) and isinstance(v, str)}
    ignored = sorted(k for k in known if wanted.get(k) is not None and k not in clean)
    if ignored and view is not None:
        view.notices.append(f"Ignored selection values that are not valid: {ignored[:8]}.")
    return clean


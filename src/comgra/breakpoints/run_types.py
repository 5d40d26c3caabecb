"""The fields of ``live/run.json`` as the app and the REST API show them: each of the type the training process
writes, or left out (None) and named in ``problems``. A hand-edited or damaged file is data: a step that is a
string, a hit count that is a list, a state that is no state must not be echoed as if the run had said it."""
from __future__ import annotations

from typing import Any

STATES = ("running", "paused", "finished", "unknown")
_INT, _TEXT, _NUMBER = (int,), (str,), (int, float)
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "training_step": _INT, "iteration": _INT, "breakpoint": _TEXT, "type_of_execution": _TEXT, "target": _TEXT,
    "condition": _TEXT, "reason": _TEXT, "notice": _TEXT, "updated": _NUMBER}


def checked_run_state(state: dict[str, Any], where: str) -> dict[str, Any]:
    """``state`` (run_state's fields) with every value of the wrong type replaced by its default, and
    ``problems``: one line per replaced value, naming the field and what it held."""
    problems = []
    checked = dict(state)
    if checked.get("state") not in STATES:
        problems.append(f"{where}: state={_shown(checked.get('state'))} is not one of {list(STATES)}; shown as 'unknown'")
        checked["state"] = "unknown"
    for name, kinds in FIELD_TYPES.items():
        value = checked.get(name)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
            problems.append(f"{where}: {name}={_shown(value)} is not {_kind(kinds)}; left out")
            checked[name] = None
    ranks = checked.get("ranks", 1)
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        problems.append(f"{where}: ranks={_shown(ranks)} is not a whole number >= 1; shown as 1")
        checked["ranks"] = 1
    return {**checked, "problems": problems}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(kinds: tuple[type, ...]) -> str:
    return {_INT: "a whole number", _TEXT: "a string", _NUMBER: "a number"}[kinds]

"""Breakpoint targets are checked against the recording (issue 25, item 6): the REST API and the app's
Breakpoints tab refuse a name that is neither a tensor of the recorded graphs nor a tracked module, with the
closest name; the tab's run line says what the run is and links the paused step to the breakpoint's target."""
from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from comgra.store import layout

from profiled_recording import GROUP, TRIAL

T = f"/api/v1/trials/{TRIAL}"


def _trial_dir(group: Path) -> Path:
    return group / "trials" / TRIAL


@pytest.fixture
def group_copy(profiled_group: Path, tmp_path: Path) -> Path:
    shutil.copytree(profiled_group, tmp_path / GROUP)
    return tmp_path / GROUP


@pytest.fixture
def copy_client(group_copy: Path) -> Any:
    from comgra.server.app import create_app

    app = create_app(group_copy, warm_up=False)
    yield app.server.test_client()
    app.server.config.clear()


@pytest.mark.parametrize(("target", "suggestion"), [("los", "loss"), ("inptu", "input"), ("net.hed", "net.head"),
                                                    ("net.head.weight", None)])  # a parameter is no target
def test_an_unknown_target_is_refused_with_the_closest_name(copy_client: Any, group_copy: Path, target: str,
                                                            suggestion: str | None) -> None:
    from comgra.breakpoints import control

    answer = copy_client.post(f"{T}/breakpoints", json={"target": target, "condition": "has_nan"})
    assert answer.status_code == 400
    error = answer.get_json()["error"]
    assert error["field"] == "target" and repr(target) in error["message"]
    if suggestion is not None:
        assert f"did you mean {suggestion!r}?" in error["message"]
    assert control.list_breakpoints(_trial_dir(group_copy)) == []


@pytest.mark.parametrize("target", ["loss", "input", "net", "net.b1.a", "net.b1.a.lin", "net.head"])
def test_tensors_and_modules_of_the_recording_are_accepted(copy_client: Any, target: str) -> None:
    answer = copy_client.post(f"{T}/breakpoints", json={"target": target, "condition": "has_nan"})
    assert answer.status_code == 201, answer.get_json()
    assert answer.get_json()["target"] == target


def test_a_patch_to_an_unknown_target_is_refused(copy_client: Any, group_copy: Path) -> None:
    from comgra.breakpoints import control

    created = copy_client.post(f"{T}/breakpoints", json={"target": "loss", "condition": "has_nan"}).get_json()
    answer = copy_client.patch(f"{T}/breakpoints/{created['id']}", json={"target": "lss"})
    assert answer.status_code == 400 and answer.get_json()["error"]["field"] == "target"
    assert "did you mean 'loss'?" in answer.get_json()["error"]["message"]
    assert [b["target"] for b in control.list_breakpoints(_trial_dir(group_copy))] == ["loss"]


def test_before_any_graph_is_recorded_every_target_is_accepted(group_copy: Path) -> None:
    """A run that has recorded nothing yet: the recording knows no tensor names, the training checks them."""
    from comgra.server.app import create_app

    shutil.rmtree(layout.rank_dir(_trial_dir(group_copy), "steps", 0))
    app = create_app(group_copy, warm_up=False)
    try:
        answer = app.server.test_client().post(f"{T}/breakpoints", json={"target": "anything", "condition": "has_nan"})
        assert answer.status_code == 201
    finally:
        app.server.config.clear()


def _text(component: Any) -> str:
    if isinstance(component, (list, tuple)):
        return "".join(_text(c) for c in component)
    if isinstance(component, str):
        return component
    return _text(getattr(component, "children", None) or "")


def _links(component: Any) -> list[str]:
    if isinstance(component, (list, tuple)):
        return [link for c in component for link in _links(c)]
    found = [component.href] if getattr(component, "href", None) else []
    children = getattr(component, "children", None)
    return found + (_links(children) if children is not None and not isinstance(children, str) else [])


def test_an_aborted_run_says_so_and_its_controls_are_off(group_copy: Path) -> None:
    from comgra.breakpoints import control
    from comgra.server.breakpoints import breakpoints_view

    trial_dir = _trial_dir(group_copy)
    control.write_run_state(trial_dir, {"state": "finished", "reason": "aborted", "training_step": 7})
    view = breakpoints_view(TRIAL, trial_dir)
    assert _text(view["state"]).startswith("aborted at training step 7 (stopped by Abort)")
    assert view["controls_disabled"] is True
    control.write_run_state(trial_dir, {"state": "finished", "reason": None, "training_step": 9})
    view = breakpoints_view(TRIAL, trial_dir)
    assert _text(view["state"]).startswith("finished at training step 9") and "Abort)" not in _text(view["state"])
    assert view["controls_disabled"] is True


def test_the_paused_step_link_selects_the_breakpoints_target(group_copy: Path) -> None:
    from comgra.breakpoints import control
    from comgra.server.breakpoints import breakpoints_view

    trial_dir = _trial_dir(group_copy)
    with socket.socket() as listener:  # run_state trusts a paused state only from a live process on this host
        listener.bind(("127.0.0.1", 0))
        control.write_run_state(trial_dir, {
            "state": "paused", "training_step": 2, "iteration": 0, "type_of_execution": "main", "breakpoint": "bp1",
            "target": "loss", "condition": "step == 2", "pid": os.getpid(), "hostname": socket.gethostname(),
            "host": "127.0.0.1", "port": listener.getsockname()[1], "token": "t" * 32})
        view = breakpoints_view(TRIAL, trial_dir)
    assert view["controls_disabled"] is False
    assert "by breakpoint bp1 (loss: step == 2)" in _text(view["state"])
    [link] = _links(view["state"])
    query = {k: v[-1] for k, v in parse_qs(urlsplit(link).query).items()}
    assert query == {"tab": "tensors", "trial": TRIAL, "type": "main", "step": "2", "iteration": "0", "node": "loss"}

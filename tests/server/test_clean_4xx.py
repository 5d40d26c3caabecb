"""Requests and recordings that used to answer 500 (issue 21, item 13): a clean 4xx, or skip-and-report.

Through the real app's Flask server (Dash and the REST API), over a recording made by the real recorder.
"""
from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from comgra.store import GroupReader
from comgra.store import format as fmt
from comgra.store import layout

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parents[1] / "api"))
from profiled_recording import TRIAL, client_of, copy_of_group, record_without_fsync  # noqa: E402

T = f"/api/v1/trials/{TRIAL}"
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_without_fsync(tmp_path_factory.mktemp("clean4xx") / "store", steps=4, resource_seconds=None)


@pytest.fixture
def group_dir(recorded: Path, tmp_path: Path) -> Path:
    return copy_of_group(recorded, tmp_path)


@pytest.fixture
def client(group_dir: Path) -> Iterator[Any]:
    yield from client_of(group_dir)


def no_error_logged(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


@pytest.mark.parametrize("path", ["/_dash-component-suites/../..", "/_dash-component-suites/../../etc/passwd",
                                  "/_dash-component-suites/dash/x/../../../y.js",
                                  "/_dash-component-suites/dash/deps/..%2f..%2fx.js",
                                  "/_dash-component-suites/not_a_library/x.js"])
def test_a_component_suite_path_dash_does_not_serve_is_404(client: Any, caplog: pytest.LogCaptureFixture,
                                                           path: str) -> None:
    assert client.get(path).status_code == 404
    no_error_logged(caplog)


@pytest.mark.parametrize(("method", "route"), [("post", f"{T}/breakpoints"),
                                               ("patch", f"{T}/breakpoints/some-id")])
@pytest.mark.parametrize("body", [DEEP, '{"target": ' + DEEP + "}"])
def test_a_deeply_nested_body_is_400(client: Any, caplog: pytest.LogCaptureFixture, method: str, route: str,
                                     body: str) -> None:
    response = getattr(client, method)(route, data=body, content_type="application/json")
    assert response.status_code == 400
    assert response.get_json()["error"]["field"] == "body"
    no_error_logged(caplog)


def test_a_deeply_nested_dash_callback_body_is_400_without_a_traceback(client: Any,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    response = client.post("/_dash-update-component", data=DEEP, content_type="application/json")
    assert response.status_code == 400
    no_error_logged(caplog)


def _with_modules(group_dir: Path, modules: Any) -> Path:
    path = fmt.trial_dir(group_dir, TRIAL) / fmt.TRIAL_META
    document = json.loads(path.read_text())
    path.write_text(json.dumps({**document, "modules": [*document["modules"], *modules]}))
    return path


ODD_MODULES = {
    "a string": ["net"],
    "a number": [7],
    "submodules a dict": [{"name": "odd", "submodules": {"a": 1}}],
    "a submodule a string": [{"name": "odd", "submodules": ["child"]}],
    "parameters of strings": [{"name": "odd", "parameters": ["w"]}],
    "numel a string": [{"name": "odd", "parameters": [{"name": "w", "numel": "12"}]}],
    "name a list": [{"name": ["odd"], "submodules": []}],
    "nested very deeply": [json.loads("{\"name\": \"a\", \"submodules\": [" * 200 + "{}" + "]}" * 200)],
}


@pytest.mark.parametrize("case", ODD_MODULES)
def test_module_entries_of_an_unexpected_shape_are_left_out_and_reported(group_dir: Path, case: str,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    from comgra.server.app import create_app
    from comgra.service import RecordingService

    meta = _with_modules(group_dir, ODD_MODULES[case])
    app = create_app(group_dir, warm_up=False)
    try:
        response = app.server.test_client().get(f"{T}/modules")
        assert response.status_code == 200, response.get_json()
        body = response.get_json()
        assert [m["name"] for m in body["modules"]] == ["net"]  # the recorded tree, intact
        assert any("trial.json" in p and "modules entry 1" in p for p in body["problems"]), body["problems"]
    finally:
        app.server.config.clear()
    service = RecordingService(group_dir)
    try:
        view = service.resolve({"trial": TRIAL})
        assert any("modules entry 1" in b for b in view.banners), view.banners
        assert [m["name"] for m in service.modules(TRIAL)] == ["net"]
    finally:
        service.close()
    assert str(meta) in GroupReader(group_dir).trial(TRIAL).problems
    no_error_logged(caplog)


def test_a_step_index_chunk_with_every_row_twice_lists_each_step_once(group_dir: Path, client: Any) -> None:
    (path,) = fmt.chunk_files(layout.rank_dir(fmt.trial_dir(group_dir, TRIAL), "steps", 0))
    rows = pq.read_table(path)
    pq.write_table(pa.concat_tables([rows, rows]), path)
    trial = GroupReader(group_dir).trial(TRIAL)
    steps = trial.steps()["training_step"].to_pylist()
    assert steps == sorted(set(steps)) and len(steps) == rows.num_rows
    assert trial.problems == [str(path)]
    body = client.get(f"{T}/steps").get_json()
    assert [r["training_step"] for r in body["steps"]] == sorted(rows["training_step"].to_pylist())
    assert any(path.name in p and "twice" in p for p in body["problems"])

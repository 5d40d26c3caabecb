"""``GET /trials/<t>/steps`` of a long run builds its JSON a slice of rows at a time (issue 31 item 13, round six).

The step index grows with the run (a live run's 20 minutes: 2,400 recorded steps). Its answer was built as one
Python dict per row, copied again for JSON: 12 times the answer's size in Python objects at once, on every request,
and more each minute. Now the rows are Python objects ``json_rows.ROWS_PER_SLICE`` at a time: the answer's peak is
a small multiple of its text whatever the run's length, and the text is what it was.
"""
from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pyarrow as pa

from comgra.server.api import plain
from comgra.server.app import create_app
from comgra.service import RecordingService
from comgra.store import GroupReader


class _Index:
    def __init__(self, table: pa.Table):
        self.table = table


def _steps_table(rows: int) -> pa.Table:
    return pa.table({"training_step": pa.array(range(0, rows * 10, 10), pa.int64()),
                     "type_of_execution": ["training"] * rows, "iteration": pa.array([0] * rows, pa.int32()),
                     "graph": ["3f9c2e1b4d5a" * 3] * rows, "batch_size": pa.array([32] * rows, pa.int32()),
                     "kinds": [["forward", "gradient"]] * rows, "samples": [[0, 1]] * rows, "categories": [["a"]] * rows,
                     "wall_time": [1.7e9 + i / 3 for i in range(rows)], "rank": pa.array([0] * rows, pa.int32())})


def _peak_of_answer(http: Any, path: str) -> tuple[int, bytes]:
    tracemalloc.start()
    try:
        response = http.get(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 200, response.data[:300]
    return peak, response.data


def test_a_long_run_s_steps_answer_is_not_a_python_object_per_row_at_once(recording, monkeypatch) -> None:
    trial = GroupReader(recording).trials()[0]
    app = create_app(recording, poll_seconds=60, warm_up=False, findings_scan=False)
    http = app.server.test_client()
    http.get(f"/api/v1/trials/{trial}/steps")  # the imports and the trial's first reads, outside the count
    table = _steps_table(6000)
    monkeypatch.setattr(RecordingService, "step_index", lambda self, trial_id, rank=None: _Index(table))
    peak, body = _peak_of_answer(http, f"/api/v1/trials/{trial}/steps")
    answer = json.loads(body)
    assert answer["steps"] == plain(table.to_pylist()) and answer["trial"] == trial and answer["rank"] == 0
    # Before: 12.5 times the answer's 1.3 MiB (a dict of 11 items and its values per row, twice); the text, its
    # parts, their join and the response's bytes are about 4 times it.
    print(f"peak {peak / 2**20:.2f} MiB for {len(body) / 2**20:.2f} MiB")
    assert peak < 5 * len(body), (peak / 2**20, len(body) / 2**20)


def test_the_steps_answer_is_the_same_text_as_the_whole_list_s(recording) -> None:
    from flask import json as flask_json

    trial = GroupReader(recording).trials()[0]
    app = create_app(recording, poll_seconds=60, warm_up=False, findings_scan=False)
    body = app.server.test_client().get(f"/api/v1/trials/{trial}/steps").data
    with app.server.app_context():
        rows = GroupReader(recording).trial(trial).steps(0).to_pylist()
        expected = flask_json.dumps(plain({"trial": trial, "rank": 0, "steps": rows, "problems": [], "total": len(rows),
                                           "offset": 0}),
                                    separators=(",", ":"))
    assert body.decode() == expected and len(rows) > 1


def test_the_step_index_keeps_no_python_object_per_step() -> None:
    """The index of a live run is built again at each new steps chunk and grows with the run: each step's type is
    a code of 4 bytes, not a Python string (about 65 bytes a step before)."""
    from comgra.service.steps import StepIndex

    rows = 20_000
    table = _steps_table(rows).set_column(1, "type_of_execution",
                                          pa.array(["training", "evaluation"] * (rows // 2)))
    tracemalloc.start()
    try:
        index = StepIndex(table)
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept / rows < 16, kept / rows
    assert index.types_of_execution() == ["evaluation", "training"] and index.main_type() == "evaluation"
    assert index.steps_of("evaluation").tolist() == list(range(10, rows * 10, 20))
    assert index.types_at(20) == ["training"] and index.steps_of("none of them").tolist() == []


def test_a_long_run_s_steps_come_whole_or_a_page_at_a_time(recording, monkeypatch) -> None:
    """Without ``limit`` every row from ``offset``; pages of ``limit`` rows, followed until ``offset + len(steps)``
    reaches ``total``, are the index's rows in order; a page past the end is empty; a bad limit is a 400."""
    trial = GroupReader(recording).trials()[0]
    http = create_app(recording, poll_seconds=60, warm_up=False, findings_scan=False).server.test_client()
    table = _steps_table(2445)
    monkeypatch.setattr(RecordingService, "step_index", lambda self, trial_id, rank=None: _Index(table))
    whole = http.get(f"/api/v1/trials/{trial}/steps").get_json()
    assert whole["steps"] == plain(table.to_pylist()) and whole["total"] == table.num_rows and whole["offset"] == 0
    rows, offset, sizes = [], 0, []
    while True:
        page = http.get(f"/api/v1/trials/{trial}/steps?offset={offset}&limit=700").get_json()
        assert page["offset"] == offset and page["total"] == table.num_rows
        rows += page["steps"]
        sizes.append(len(page["steps"]))
        offset += len(page["steps"])
        if offset >= page["total"]:
            break
    assert rows == whole["steps"] and sizes == [700, 700, 700, 345]
    assert http.get(f"/api/v1/trials/{trial}/steps?offset=2000").get_json()["steps"] == whole["steps"][2000:]
    past = http.get(f"/api/v1/trials/{trial}/steps?offset={table.num_rows + 5}").get_json()
    assert past["steps"] == [] and past["total"] == table.num_rows
    refused = http.get(f"/api/v1/trials/{trial}/steps?limit=0")
    error = refused.get_json()["error"]
    assert refused.status_code == 400 and error["field"] == "limit" and "limit" in error["message"]

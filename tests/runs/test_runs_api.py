"""GET /api/v1/runs over a real recorded sweep, through the app's Flask server."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.runs.sweep_recording import CRASHED, TRIALS


@pytest.fixture
def client(sweep: Path):
    from comgra.server.app import create_app

    app = create_app(sweep, warm_up=False)
    yield app.server.test_client()
    app.server.config.clear()


def test_runs_answer_the_documented_rows(client) -> None:
    answer = client.get("/api/v1/runs").get_json()
    assert answer["total"] == 4
    row = next(r for r in answer["runs"] if r["trial"] == "lr0.01_seed0")
    assert row == {"trial": "lr0.01_seed0", "hyperparameters": {"lr": 0.01, "model.width": 16, "seed": 0,
                                                                "optimizer": "sgd"},
                   "kpis": {"accuracy/val": {"last": pytest.approx(0.3), "best": pytest.approx(0.3),
                                             "min": pytest.approx(0.0), "max": pytest.approx(0.3)},
                            "loss/train": {"last": 0.7, "best": 0.7, "min": 0.7, "max": 1.0}},
                   "findings": {"error": 0, "warning": 0, "info": 0}, "status": "finished", "steps": 4,
                   "duration": row["duration"]}
    assert row["duration"] >= 0
    assert {r["trial"]: r["status"] for r in answer["runs"]} == {**dict.fromkeys(TRIALS, "finished"),
                                                                 CRASHED: "crashed"}


def test_filter_sort_offset_limit(client) -> None:
    answer = client.get("/api/v1/runs", query_string={"filter": "optimizer=adam", "sort": "-kpis.loss/train.last",
                                                      "offset": 1, "limit": 1}).get_json()
    assert answer["total"] == 3
    assert [r["trial"] for r in answer["runs"]] == ["lr0.1_seed1"]


@pytest.mark.parametrize(("query", "field", "named"), [
    ({"filter": "lr=(0.1"}, "filter", "filter='lr=(0.1' is not a regular expression"),
    ({"sort": "stpes"}, "sort", "did you mean 'steps'"),
    ({"limit": 0}, "limit", "limit=0"),
    ({"limit": 10**6}, "limit", "page with offset"),
])
def test_a_bad_query_is_a_clean_400_naming_it(client, query, field, named) -> None:
    response = client.get("/api/v1/runs", query_string=query)
    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error["field"] == field
    assert named in error["message"]

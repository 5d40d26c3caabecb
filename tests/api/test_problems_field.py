"""Every REST answer built from a trial says what it had to leave out (issue 21, item 11).

A recording made by the real recorder is damaged on disk (chunks overwritten, a column retyped); the
API is asked through the real app's Flask server. Before, ``series`` came back with steps missing,
``kpis`` and ``notes`` shorter and ``findings`` empty, with nothing saying so.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from comgra.store import format as fmt
from comgra.store import layout

pytest.importorskip("torch")

from profiled_recording import TRIAL, client_of, copy_of_group, record_without_fsync  # noqa: E402

T = f"/api/v1/trials/{TRIAL}"
# Every route whose answer is built from the trial's files, with the arguments it needs.
TRIAL_ROUTES = [f"{T}/steps", f"{T}/graph?step=0", f"{T}/values?step=0", f"{T}/series?node=input&role=input",
                f"{T}/kpis", f"{T}/notes", f"{T}/modules", f"{T}/layers", f"{T}/layers/net.b1", f"{T}/profile",
                f"{T}/flamegraph", f"{T}/trace", f"{T}/resources"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_without_fsync(tmp_path_factory.mktemp("problems") / "store", steps=4)


@pytest.fixture
def group_dir(recorded: Path, tmp_path: Path) -> Path:
    return copy_of_group(recorded, tmp_path)


@pytest.fixture
def client(group_dir: Path) -> Iterator[Any]:
    yield from client_of(group_dir)


def overwrite(group_dir: Path, table: str) -> list[str]:
    """Every chunk of ``table`` replaced by junk; returns their names as ``problems`` lists them."""
    names = []
    for path in fmt.chunk_files(layout.rank_dir(fmt.trial_dir(group_dir, TRIAL), table, 0)):
        path.write_bytes(b"junk" * 64)
        names.append(f"{table}/{path.name}")
    assert names
    return names


@pytest.mark.parametrize("route", TRIAL_ROUTES)
def test_an_intact_trial_answers_with_no_problems(client: Any, route: str) -> None:
    response = client.get(route)
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["problems"] == []


@pytest.mark.parametrize(("route", "table"), [
    (f"{T}/series?node=input&role=input", "tensors"), (f"{T}/kpis", "kpis"), (f"{T}/notes", "notes"),
    (f"{T}/layers", "layers"), (f"{T}/layers/net.b1", "layers"), (f"{T}/profile", "layers"),
    (f"{T}/flamegraph", "layers"), (f"{T}/trace", "layers"), (f"{T}/resources", "resources"),
])
def test_an_answer_with_damaged_data_left_out_says_so(client: Any, group_dir: Path, route: str, table: str) -> None:
    damaged = overwrite(group_dir, table)
    response = client.get(route)
    assert response.status_code in (200, 404), response.get_json()
    body = response.get_json()
    listed = body["problems"] if response.status_code == 200 else [body["error"]["message"]]
    for name in damaged:
        assert any(name in p for p in listed), (name, listed)


def test_values_of_a_step_whose_chunk_is_damaged_name_it(client: Any, group_dir: Path) -> None:
    damaged = overwrite(group_dir, "tensors")
    response = client.get(f"{T}/values?step=0")
    body = response.get_json()
    text = str(body.get("problems") if response.status_code == 200 else body["error"]["message"])
    assert all(name in text for name in damaged), body
    if response.status_code == 200:
        assert body["values"] in (None, {}) or body["problems"]


def test_findings_of_a_trial_with_a_retyped_chunk_are_not_an_empty_all_clear(client: Any, group_dir: Path) -> None:
    (path,) = fmt.chunk_files(layout.rank_dir(fmt.trial_dir(group_dir, TRIAL), "tensors", 0))[:1]
    data = pq.read_table(path)
    index = data.schema.get_field_index("mean")
    pq.write_table(data.set_column(index, pa.field("mean", pa.string()),
                                   pa.array([str(v) for v in data["mean"].to_pylist()])), path)
    response = client.get("/api/v1/findings", query_string={"trial": TRIAL})
    assert response.status_code == 200, response.get_json()
    (entry,) = response.get_json()["findings"]
    assert any(path.name in p and "not a chunk of this table" in p for p in entry["problems"]), entry["problems"]

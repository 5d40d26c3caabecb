"""Damaged files, round three (issue 31, items 10-12): a recording made by the real recorder, damaged on disk
as a hand, a tool or a full disk would, read through the reader, the REST API (the real app's Flask server)
and the scan. What was left out is always said, and what is read is read the same way on every call."""
from __future__ import annotations

import errno
import json
import os
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


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_without_fsync(tmp_path_factory.mktemp("round3") / "store", steps=6)


@pytest.fixture
def group_dir(recorded: Path, tmp_path: Path) -> Path:
    return copy_of_group(recorded, tmp_path)


@pytest.fixture
def client(group_dir: Path) -> Iterator[Any]:
    yield from client_of(group_dir)


def trial_dir(group_dir: Path) -> Path:
    return fmt.trial_dir(group_dir, TRIAL)


def rewrite(path: Path, change: Any) -> None:
    """The chunk rewritten by pyarrow with ``change(table)``, as a tool that edits Parquet would."""
    table = pq.read_table(path)
    pq.write_table(change(table), path)


# -- item 10: a tensors chunk whose training_step is all null ---------------------------------------------
def _null_steps(table: pa.Table) -> pa.Table:
    index = table.schema.get_field_index("training_step")
    return table.set_column(index, table.schema.field(index), pa.nulls(table.num_rows, pa.int64()))


def test_a_tensors_chunk_without_steps_is_skipped_and_listed_by_reader_rest_and_scan(client: Any,
                                                                                    group_dir: Path) -> None:
    from comgra.analysis import Scanner
    from comgra.store.reader import GroupReader

    chunks = fmt.chunk_files(layout.rank_dir(trial_dir(group_dir), "tensors", 0))
    chunk = chunks[0]
    rewrite(chunk, _null_steps)
    trial = GroupReader(group_dir).trial(TRIAL)
    series = trial.series(node="input", role="input", iteration=0)
    assert series["training_step"].null_count == 0 and (series.num_rows > 0) == (len(chunks) > 1)
    assert any(chunk.name in p for p in trial.problems), trial.problems
    answer = client.get(f"{T}/series?node=input&role=input").get_json()
    assert None not in answer["training_step"]
    assert any(chunk.name in p and "training_step" in p for p in answer["problems"]), answer["problems"]
    result = Scanner().scan(group_dir)
    assert any(chunk.name in p for p in result.problems), result.problems


# -- item 11: a steps chunk that holds every row twice --------------------------------------------------
def test_a_steps_chunk_with_every_row_twice_gives_the_same_steps_on_every_call(group_dir: Path) -> None:
    from comgra.store.reader import GroupReader

    chunks = fmt.chunk_files(layout.rank_dir(trial_dir(group_dir), "steps", 0))
    for chunk in chunks:
        rewrite(chunk, lambda table: pa.concat_tables([table, table]))
    trial = GroupReader(group_dir).trial(TRIAL)
    counts = [trial.steps().num_rows for _ in range(4)]
    distinct = len({(r["rank"], r["training_step"], r["iteration"]) for r in trial.steps().to_pylist()})
    assert counts == [distinct] * 4 and distinct > 0, counts
    assert all(any(c.name in p for p in trial.problems) for c in chunks), trial.problems


# -- item 12: values and graph of a step inside a damaged chunk ----------------------------------------
@pytest.mark.parametrize("route", ["values", "graph"])
def test_values_and_graph_of_a_step_in_a_damaged_steps_chunk_name_the_damage(client: Any, group_dir: Path,
                                                                             route: str) -> None:
    chunk = fmt.chunk_files(layout.rank_dir(trial_dir(group_dir), "steps", 0))[0]
    step = fmt.step_range_of(chunk.name)[0]
    chunk.write_bytes(b"junk" * 64)
    response = client.get(f"{T}/{route}?step={step}")
    body = response.get_json()
    assert response.status_code == 404, body
    assert any(chunk.name in p for p in body["problems"]), body
    assert chunk.name in body["error"]["message"]


def test_a_graph_document_that_is_damaged_is_named(client: Any, group_dir: Path) -> None:
    for graph in (trial_dir(group_dir) / "graphs").glob("*.json"):
        graph.write_text("{")
    body = client.get(f"{T}/graph?step=0").get_json()
    assert body["problems"] and any(".json" in p for p in body["problems"]), body


def test_run_with_wrong_typed_values_reports_them(client: Any, group_dir: Path) -> None:
    from comgra.breakpoints import control

    control.write_run_state(trial_dir(group_dir), {
        "state": "finished", "training_step": "7; rm -rf /", "iteration": [1], "reason": {"x": 1},
        "ranks": "many", "breakpoint": 3.5, "target": "loss", "hits": {"bp1": "x", "bp2": 2}})
    body = client.get(f"{T}/run").get_json()
    assert body["state"] == "finished" and body["target"] == "loss" and body["hits"] == {"bp2": 2}
    assert body["training_step"] is None and body["iteration"] is None and body["reason"] is None
    assert body["breakpoint"] is None and body["ranks"] == 1
    named = " ".join(body["problems"])
    for field in ("training_step", "iteration", "reason", "ranks", "breakpoint"):
        assert f"{field}=" in named, (field, body["problems"])
    control.write_run_state(trial_dir(group_dir), {"state": ["paused"], "training_step": 3})
    body = client.get(f"{T}/run").get_json()
    assert body["state"] == "unknown" and body["training_step"] == 3 and "state=" in body["problems"][0]


def test_a_resources_document_nested_50000_deep_is_listed(client: Any, group_dir: Path) -> None:
    document = trial_dir(group_dir) / "resources-r000.json"
    document.write_text("[" * 50_000 + "]" * 50_000)
    body = client.get(f"{T}/resources").get_json()
    assert any("resources-r000.json" in p and "deep" in p for p in body["problems"]), body["problems"]


@pytest.mark.parametrize(("code", "said"), [(errno.ENOSPC, "is full"), (errno.EROFS, "read-only")])
def test_a_full_or_read_only_disk_is_said_as_such(client: Any, group_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                   code: int, said: str) -> None:
    """The write of breakpoints.json meets the disk's own error (os.replace is where the file lands)."""
    def refused(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError(code, os.strerror(code), str(target))

    monkeypatch.setattr(os, "replace", refused)
    response = client.post(f"{T}/breakpoints", json={"target": "loss", "condition": "has_nan"})
    body = response.get_json()
    assert response.status_code == 507, body
    assert said in body["error"]["message"] and "internal error" not in body["error"]["message"]


def test_each_distinct_damage_of_breakpoints_json_warns_once(tmp_path: Path) -> None:
    from comgra.breakpoints.monitor import BreakpointMonitor
    from comgra.config import BreakpointSettings

    live = tmp_path / "live"
    live.mkdir()
    warned: list[tuple[str, str]] = []
    monitor = BreakpointMonitor(tmp_path, BreakpointSettings(poll_interval_s=0), rank=0, world_size=1, initial=[],
                                warn=lambda key, message: warned.append((key, message)) if key not in
                                {k for k, _ in warned} else None)
    damages = ['{"next_id": 2, "breakpoints": [{"target": "loss", "condition": "has_nan"}]}',  # no id
               '{"next_id": 2, "breakpoints": ["bp1"]}', "[" * 1000, '{"next_id": 2, "breakpoints": ["bp1"]}']
    for step, damage in enumerate(damages):
        (live / "breakpoints.json").write_text(damage)
        os.utime(live / "breakpoints.json", ns=(step * 10**9, step * 10**9))  # a new version for the monitor
        monitor.start_batch(step, None)
    monitor.close()
    messages = [m for _, m in warned if "keeps its breakpoints" in m]
    assert len(messages) == 3, messages  # three distinct damages, the last one a repeat of the second

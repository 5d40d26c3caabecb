"""The reader: corrupt chunks are skipped and reported, versions are checked, names get suggestions."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from comgra.errors import SelectionError, StoreError
from comgra.store import GroupReader, TrialReader
from comgra.store import format as fmt
from comgra.store.writer import ChunkWriter
from comgra.store import layout

STEPS = (0, 10, 20)
GRAPH_HASH = "00000000000000ab"  # the shape capture/graph.py graph_hash gives
GRAPH = {"format_version": 1, "hash": GRAPH_HASH, "edges": [],
         "nodes": [{"id": "x", "node": "x", "role": "x", "roles": ["x"], "column": 0, "row": 0}]}


def _tensor_row(step: int, node: str, value: float) -> dict:
    return {"training_step": step, "kind": "forward", "iteration": 0, "node": node, "role": node,
            "tensor_name": node, "tensor_type": "calculated", "aggregation": "mean", "sample": -1,
            "category": None, "shape": [4, 2], **dict.fromkeys(fmt.STATISTICS, value), "svd_max": None,
            "num_neurons": 2, "neurons": [value, -value]}


def _write_trial(group_dir: Path, trial_id: str = "trial_a") -> Path:
    """A recording with one chunk per step in every table, written by the real writer."""
    directory = fmt.trial_dir(group_dir, trial_id)
    fmt.write_json_atomic(directory / fmt.TRIAL_META, {"format_version": fmt.FORMAT_VERSION, "trial_id": trial_id})
    fmt.write_json_atomic(directory / "graphs" / f"{GRAPH_HASH}.json", GRAPH)
    writer = ChunkWriter(directory, flush_seconds=60.0, compact_at_close=False)
    for step in STEPS:
        writer.put_table("tensors", pa.Table.from_pylist(
            [_tensor_row(step, node, step + i) for i, node in enumerate(("x", "y"))], schema=fmt.TENSORS_SCHEMA))
        writer.put_table("steps", pa.Table.from_pylist([{
            "training_step": step, "type_of_execution": "main", "iteration": 0, "graph": GRAPH_HASH, "batch_size": 4,
            "kinds": ["forward"], "samples": [], "categories": None, "wall_time": 1.0}], schema=fmt.STEPS_SCHEMA))
        writer.put_table("kpis", pa.Table.from_pylist([{
            "kpi_group": "loss", "kpi_name": "", "type_of_execution": "main", "timepoint": step,
            "value": step / 10}], schema=fmt.KPIS_SCHEMA))
        writer.put_table("notes", pa.Table.from_pylist([{"seq": step, "wall_time": float(step),
                                                         "note": f"note {step}"}], schema=fmt.NOTES_SCHEMA))
        writer.flush()
    writer.close()
    assert writer.error is None
    return directory


@pytest.fixture
def group_dir(tmp_path: Path) -> Path:
    group = tmp_path / "group"
    _write_trial(group)
    return group


def _chunk_of(directory: Path, table: str, step: int) -> Path:
    (path,) = [p for p in (layout.rank_dir(directory, table, 0)).glob("*.parquet") if fmt.step_range_of(p.name) == (step, step)]
    return path


def test_a_clean_recording_reads_completely(group_dir: Path) -> None:
    trial = GroupReader(group_dir).trial("trial_a")
    assert trial.steps()["training_step"].to_pylist() == list(STEPS)
    assert trial.kpis()["timepoint"].to_pylist() == list(STEPS)
    assert trial.notes() == [f"note {s}" for s in STEPS]
    assert trial.selection(training_step=10, node="y")["mean"].to_pylist() == [11.0]
    assert trial.series(node="x", role="x", iteration=0)["value"].to_pylist() == [0.0, 10.0, 20.0]
    assert trial.graph(GRAPH_HASH)["hash"] == GRAPH_HASH
    assert trial.problems == []


def _garbage(path: Path) -> None:
    path.write_bytes(b"this is not parquet" * 10)


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _damaged_pages(path: Path) -> None:
    """The footer is intact, the data between the magic bytes is not."""
    data = bytearray(path.read_bytes())
    footer_length = int.from_bytes(data[-8:-4], "little")
    for i in range(4, len(data) - 8 - footer_length):
        data[i] = 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {"garbage": _garbage, "truncated": _truncated, "empty": _empty, "damaged_pages": _damaged_pages}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_corrupt_tensor_chunk_is_skipped_and_listed(damage, group_dir: Path) -> None:
    directory = fmt.trial_dir(group_dir, "trial_a")
    bad = _chunk_of(directory, "tensors", 10)
    damage(bad)
    trial = GroupReader(group_dir).trial("trial_a")
    assert trial.selection(training_step=20, node="x")["mean"].to_pylist() == [20.0]
    assert trial.selection(training_step=10).num_rows == 0
    assert trial.series(node="x", role="x", iteration=0)["training_step"].to_pylist() == [0, 20]
    assert trial.problems == [str(bad)]
    assert trial.selection(training_step=0, node="y")["mean"].to_pylist() == [1.0]
    assert trial.problems == [str(bad)]  # listed once


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
@pytest.mark.parametrize("table", ["steps", "kpis", "notes"])
def test_corrupt_small_table_chunk_is_skipped_and_listed(table: str, damage, group_dir: Path) -> None:
    directory = fmt.trial_dir(group_dir, "trial_a")
    bad = _chunk_of(directory, table, 10) if table != "notes" else sorted((layout.rank_dir(directory, "notes", 0)).glob("*.parquet"))[1]
    damage(bad)
    trial = GroupReader(group_dir).trial("trial_a")
    assert trial.steps()["training_step"].to_pylist() == ([0, 20] if table == "steps" else list(STEPS))
    assert trial.kpis()["timepoint"].to_pylist() == ([0, 20] if table == "kpis" else list(STEPS))
    assert trial.notes() == (["note 0", "note 20"] if table == "notes" else [f"note {s}" for s in STEPS])
    assert trial.problems == [str(bad)]


def test_temporary_and_hidden_files_are_never_read(group_dir: Path) -> None:
    directory = fmt.trial_dir(group_dir, "trial_a")
    for table in fmt.TABLES:
        (layout.rank_dir(directory, table, 0)).mkdir(parents=True, exist_ok=True)  # layers, resources: a recording without profiling has none
        (layout.rank_dir(directory, table, 0) / ".tmp-12345.parquet").write_bytes(b"half-written")
        (layout.rank_dir(directory, table, 0) / ".hidden.parquet").write_bytes(b"half-written")
    trial = GroupReader(group_dir).trial("trial_a")
    assert trial.steps().num_rows == len(STEPS)
    assert trial.series(node="x", role="x", iteration=0).num_rows == len(STEPS)
    assert trial.problems == []


def test_new_chunks_of_a_live_run_appear_on_the_next_call(group_dir: Path) -> None:
    trial = GroupReader(group_dir).trial("trial_a")
    assert trial.steps().num_rows == len(STEPS)
    writer = ChunkWriter(fmt.trial_dir(group_dir, "trial_a"), flush_seconds=60.0, compact_at_close=False)
    writer._seq = 100  # after the chunks already there, as a resumed writer would be
    writer.put_table("steps", pa.Table.from_pylist([{
        "training_step": 30, "type_of_execution": "main", "iteration": 0, "graph": GRAPH_HASH, "batch_size": 4,
        "kinds": ["forward"], "samples": [], "categories": None, "wall_time": 2.0}], schema=fmt.STEPS_SCHEMA))
    writer.close()
    assert trial.steps()["training_step"].to_pylist() == [*STEPS, 30]


@pytest.mark.parametrize(("metadata", "expected"), [
    ({"format_version": fmt.FORMAT_VERSION + 1}, f"format_version {fmt.FORMAT_VERSION + 1}"),
    ({"format_version": 99}, "pip install -U comgra"),
    ({"format_version": "1"}, "format_version '1'"),
    ({}, "format_version None"),
])
def test_metadata_of_an_unknown_version_is_refused(metadata: dict, expected: str, group_dir: Path) -> None:
    meta = fmt.trial_dir(group_dir, "trial_a") / fmt.TRIAL_META
    meta.write_text(json.dumps(metadata))
    with pytest.raises(StoreError) as raised:
        GroupReader(group_dir).trial("trial_a")
    message = str(raised.value)
    assert expected in message and "'trial_a'" in message and f"reads up to {fmt.FORMAT_VERSION}" in message


def test_unreadable_metadata_names_the_file(group_dir: Path) -> None:
    meta = fmt.trial_dir(group_dir, "trial_a") / fmt.TRIAL_META
    meta.write_text("{not json")
    with pytest.raises(StoreError, match=r"trial\.json.* is unreadable"):
        TrialReader(meta.parent)


def test_unknown_trial_gets_a_suggestion(group_dir: Path) -> None:
    _write_trial(group_dir, "trial_b")
    group = GroupReader(group_dir)
    assert group.trials() == ["trial_a", "trial_b"]
    with pytest.raises(SelectionError) as raised:
        group.trial("trail_a")
    message = str(raised.value)
    assert "'trail_a'" in message and "did you mean 'trial_a'?" in message and "['trial_a', 'trial_b']" in message


def test_missing_group_folder(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="comgra_root_path/group"):
        GroupReader(tmp_path / "nowhere")


def test_empty_group_has_no_trials(tmp_path: Path) -> None:
    assert GroupReader(tmp_path).trials() == []


@pytest.mark.parametrize(("call", "expected"), [
    (lambda t: t.selection(training_step=0, nodes="x"), r"Unknown filter\(s\) \['nodes'\]; valid filters"),
    (lambda t: t.series(node="x", role="x", iteration=0, statistic="maen"), "did you mean 'mean'"),
    (lambda t: t.graph("00000000000000ff"), r"Graph '.*00000000000000ff.json' is unreadable"),
    (lambda t: t.graph("no_such_hash"), "names the graph 'no_such_hash'.*not a graph hash"),
], ids=["unknown_filter", "unknown_statistic", "missing_graph", "malformed_hash"])
def test_bad_queries_raise_with_the_fix(call, expected: str, group_dir: Path) -> None:
    trial = GroupReader(group_dir).trial("trial_a")
    with pytest.raises(StoreError, match=expected):
        call(trial)


def test_a_trial_without_chunks_reads_as_empty(tmp_path: Path) -> None:
    directory = fmt.trial_dir(tmp_path, "fresh")
    fmt.write_json_atomic(directory / fmt.TRIAL_META, {"format_version": fmt.FORMAT_VERSION})
    trial = GroupReader(tmp_path).trial("fresh")
    assert trial.steps().num_rows == 0 and trial.kpis().num_rows == 0 and trial.notes() == []
    assert trial.selection(training_step=0).num_rows == 0
    assert trial.selection(training_step=0).schema == fmt.SCHEMAS["tensors"]

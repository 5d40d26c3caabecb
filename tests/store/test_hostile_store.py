"""Damaged and hostile recordings: only ComgraErrors or skipped files listed as problems.

Each case damages one file of a small trial the real writer wrote. Afterwards the reader
either raises a ``StoreError`` that names the file, or skips the file, lists it in
``TrialReader.problems``, and keeps the rest of the trial readable; the app's service
answers with a banner that carries the message, never an exception's class name.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from comgra.errors import ComgraError, StoreError
from comgra.service import RecordingService
from comgra.store import GroupReader, TrialReader
from comgra.store import format as fmt
from comgra.store.writer import ChunkWriter
from comgra.store import layout

TRIAL = "trial_a"
STEPS = (0, 10, 20)
HASH = "0123456789abcdef"
GRAPH = {"format_version": 1, "hash": HASH, "edges": [{"source": "x", "target": "y"}],
         "nodes": [{"id": "x", "node": "x", "role": "input", "roles": ["x"], "column": 0, "row": 0},
                   {"id": "y", "node": "y", "role": "output", "roles": ["y"], "column": 1, "row": 0}]}
EXCEPTION_NAME = re.compile(r"\b[A-Z][A-Za-z]*(Error|Exception|Invalid)\b")


def _tensor_row(step: int, node: str, value: float) -> dict:
    return {"training_step": step, "kind": "forward", "iteration": 0, "node": node, "role": node,
            "tensor_name": node, "tensor_type": "calculated", "aggregation": "mean", "sample": -1,
            "category": None, "shape": [2], **dict.fromkeys(fmt.STATISTICS, value), "svd_max": None,
            "num_neurons": 1, "neurons": [value]}


def _steps_row(step: int, graph: str = HASH) -> dict:
    return {"training_step": step, "type_of_execution": "main", "iteration": 0, "graph": graph, "batch_size": 2,
            "kinds": ["forward"], "samples": [], "categories": None, "wall_time": 1.0}


def write_trial(group_dir: Path) -> Path:
    directory = fmt.trial_dir(group_dir, TRIAL)
    fmt.write_json_atomic(directory / fmt.TRIAL_META, {"format_version": fmt.FORMAT_VERSION, "trial_id": TRIAL,
                                                       "config": {}, "modules": []})
    fmt.write_json_atomic(directory / "graphs" / f"{HASH}.json", GRAPH)
    writer = ChunkWriter(directory, flush_seconds=60.0, compact_at_close=False)
    for step in STEPS:
        writer.put_table("tensors", pa.Table.from_pylist(
            [_tensor_row(step, n, step + i) for i, n in enumerate("xy")], schema=fmt.TENSORS_SCHEMA))
        writer.put_table("steps", pa.Table.from_pylist([_steps_row(step)], schema=fmt.STEPS_SCHEMA))
        writer.flush()
    writer.close()
    assert writer.error is None
    return directory


@pytest.fixture
def group_dir(tmp_path: Path) -> Path:
    write_trial(tmp_path / "group")
    return tmp_path / "group"


def _a_chunk(directory: Path, table: str, step: int = 10) -> Path:
    (path,) = [p for p in (layout.rank_dir(directory, table, 0)).glob("*.parquet") if fmt.step_range_of(p.name) == (step, step)]
    return path


def _steps_chunk(directory: Path, rows: list[dict], schema: pa.Schema | None = None) -> Path:
    path = layout.rank_dir(directory, "steps", 0) / fmt.chunk_name(900, 30, 30)
    table = pa.Table.from_pylist(rows, schema=schema) if schema else pa.Table.from_pylist(rows)
    pq.write_table(table, path)
    return path


def _graph_doc(document: Any) -> Callable[[Path], Path]:
    def damage(directory: Path) -> Path:
        path = directory / "graphs" / f"{HASH}.json"
        path.write_text(document if isinstance(document, str) else json.dumps(document))
        return path
    return damage


def _metadata(document: Any) -> Callable[[Path], Path]:
    def damage(directory: Path) -> Path:
        path = directory / fmt.TRIAL_META
        path.write_text(document if isinstance(document, str) else json.dumps(document))
        return path
    return damage


def _stray(table: str, name: str, data: bytes = b"not parquet") -> Callable[[Path], Path]:
    def damage(directory: Path) -> Path:
        path = (directory if table == "." else layout.rank_dir(directory, table, 0)) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path
    return damage


def _copy_of_a_chunk_named(name: str) -> Callable[[Path], Path]:
    def damage(directory: Path) -> Path:  # a readable Parquet file: only its name is foreign
        path = layout.rank_dir(directory, "tensors", 0) / name
        path.write_bytes(_a_chunk(directory, "tensors").read_bytes())
        return path
    return damage


def _null_training_step(directory: Path) -> Path:
    return _steps_chunk(directory, [{**_steps_row(30), "training_step": None}], fmt.STEPS_SCHEMA)


def _wrong_steps_schema(directory: Path) -> Path:
    return _steps_chunk(directory, [{"training_step": "thirty", "colour": 1.5}])


def _hash_that_walks_out(directory: Path) -> Path:
    secret = directory.parent.parent.parent / "secret.json"
    secret.write_text(json.dumps(GRAPH))  # a valid graph: only the path would be wrong
    return _steps_chunk(directory, [_steps_row(30, graph="../../../secret")], fmt.STEPS_SCHEMA)


def _chunk_linked_outside(directory: Path) -> Path:
    outside = directory.parent.parent.parent / "elsewhere.parquet"
    outside.write_bytes(_a_chunk(directory, "tensors").read_bytes())
    link = layout.rank_dir(directory, "tensors", 0) / fmt.chunk_name(901, 10, 10)
    link.symlink_to(outside)
    return link


def _graph_linked_outside(directory: Path) -> Path:
    outside = directory.parent.parent.parent / "graph.json"
    outside.write_text(json.dumps(GRAPH))
    path = directory / "graphs" / f"{HASH}.json"
    path.unlink()
    path.symlink_to(outside)
    return path


# How the reader must answer: "open" - opening the trial raises a StoreError; "graph" - reading the step's
# graph raises one; "skipped" - the file is listed in problems and every other step reads completely.
CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "stray_tensors_file": (_stray("tensors", "foo.parquet"), "skipped"),
    "stray_readable_tensors_file": (_copy_of_a_chunk_named("foo.parquet"), "skipped"),
    "non_numeric_chunk_name": (_copy_of_a_chunk_named("aaa-bbb-r000-000001.parquet"), "skipped"),
    "stray_steps_file": (_stray("steps", "notes.parquet"), "skipped"),
    "graph_is_a_list": (_graph_doc([]), "graph"),
    "graph_lacks_nodes": (_graph_doc({"edges": []}), "graph"),
    "graph_nodes_not_a_list": (_graph_doc({"nodes": {"x": 1}, "edges": []}), "graph"),
    "graph_node_without_id": (_graph_doc({**GRAPH, "nodes": [{"node": "x", "role": "x", "column": 0, "row": 0}]}),
                              "graph"),
    "graph_edge_to_unknown_node": (_graph_doc({**GRAPH, "edges": [{"source": "x", "target": "ghost"}]}), "graph"),
    "graph_row_not_a_number": (_graph_doc({**GRAPH, "nodes": [{**GRAPH["nodes"][0], "row": "1"}]}), "graph"),
    "graph_nested_deeply": (_graph_doc("[" * 100_000 + "]" * 100_000), "graph"),
    "graph_not_json": (_graph_doc("{nodes: ["), "graph"),
    "graph_hash_walks_out": (_hash_that_walks_out, "graph"),
    "graph_linked_outside": (_graph_linked_outside, "graph"),
    "metadata_is_a_list": (_metadata([]), "open"),
    "metadata_is_null": (_metadata(None), "open"),
    "metadata_config_not_a_dict": (_metadata({"format_version": 1, "config": [1, 2]}), "open"),
    "metadata_nested_deeply": (_metadata("[" * 100_000 + "]" * 100_000), "open"),
    "metadata_not_utf8": (_stray(".", fmt.TRIAL_META, b"\xff\xfe{"), "open"),
    **{f"format_version_{v!r}": (_metadata({"format_version": v}), "open") for v in (0, -1, True, 1.5, "1", None)},
    "null_training_step": (_null_training_step, "skipped"),
    "steps_chunk_of_a_wrong_schema": (_wrong_steps_schema, "skipped"),
    "chunk_linked_outside": (_chunk_linked_outside, "skipped"),
}


def assert_rest_is_readable(trial: TrialReader) -> None:
    assert trial.steps()["training_step"].to_pylist() == list(STEPS)
    for step in STEPS:
        assert trial.selection(training_step=step, node="y", columns=["mean"])["mean"].to_pylist() == [step + 1.0]
    assert trial.series(node="x", role="x", iteration=0)["value"].to_pylist() == [float(s) for s in STEPS]


@pytest.mark.parametrize("case", CASES)
def test_damaged_file(case: str, group_dir: Path) -> None:
    damage, outcome = CASES[case]
    bad = damage(fmt.trial_dir(group_dir, TRIAL))
    group = GroupReader(group_dir)
    if outcome == "open":
        with pytest.raises(StoreError, match=re.escape(str(bad))):
            group.trial(TRIAL)
    elif outcome == "graph":
        trial = group.trial(TRIAL)
        step_graphs = set(trial.steps()["graph"].to_pylist())
        for graph_hash in step_graphs:
            if graph_hash == HASH and case == "graph_hash_walks_out":
                assert trial.graph(graph_hash)["nodes"]  # the step that names a real graph still reads
                continue
            with pytest.raises(StoreError, match="not a graph hash" if case == "graph_hash_walks_out" else
                               re.escape(str(bad))):
                trial.graph(graph_hash)
        assert_rest_is_readable(trial) if case != "graph_hash_walks_out" else None
    else:
        trial = group.trial(TRIAL)
        assert_rest_is_readable(trial)
        assert trial.problems == [str(bad)]
    assert_the_app_answers_cleanly(group_dir)


def assert_the_app_answers_cleanly(group_dir: Path) -> None:
    service = RecordingService(group_dir)
    try:
        for wanted in ({}, {"training_step": 10}, {"training_step": 30}):
            view = service.resolve(wanted)
            for message in view.banners + view.notices:
                assert not EXCEPTION_NAME.search(message), message
    finally:
        service.close()


def test_a_damaged_chunk_is_listed_once_by_concurrent_readers(group_dir: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor
    bad = _a_chunk(fmt.trial_dir(group_dir, TRIAL), "tensors")
    bad.write_bytes(b"garbage" * 100)
    trial = GroupReader(group_dir).trial(TRIAL)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: trial.series(node="x", role="x", iteration=0), range(32)))
    assert trial.problems == [str(bad)]


# -- random damage -------------------------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["nodes", "edges", "id", "node", "role", "column", "row", "roles", "source", "target",
                         "format_version", "config", "modules", "x"]), inner, max_size=5),
    max_leaves=20)


def _answers_or_store_error(call: Callable[[], Any]) -> None:
    try:
        call()
    except ComgraError:
        pass


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=json_values, where=st.sampled_from(["graph", "metadata"]))
def test_random_json_documents_give_only_comgra_errors(tmp_path_factory, document: Any, where: str) -> None:
    group_dir = tmp_path_factory.mktemp("random_json") / "group"
    directory = write_trial(group_dir)
    (_graph_doc if where == "graph" else _metadata)(document)(directory)
    try:
        trial = GroupReader(group_dir).trial(TRIAL)
    except StoreError:
        return
    _answers_or_store_error(lambda: trial.graph(HASH))
    assert_rest_is_readable(trial)
    assert_the_app_answers_cleanly(group_dir)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.sampled_from(["tensors", "steps"]), cut=st.floats(0, 1), noise=st.binary(max_size=64),
       at=st.floats(0, 1))
def test_truncated_and_overwritten_chunks_are_skipped(tmp_path_factory, table: str, cut: float, noise: bytes,
                                                      at: float) -> None:
    group_dir = tmp_path_factory.mktemp("random_bytes") / "group"
    bad = _a_chunk(write_trial(group_dir), table)
    data = bytearray(bad.read_bytes()[: int(len(bad.read_bytes()) * cut) or None])
    start = int(len(data) * at)
    data[start:start + len(noise)] = noise
    bad.write_bytes(bytes(data))
    trial = GroupReader(group_dir).trial(TRIAL)
    _answers_or_store_error(trial.steps)
    for step in STEPS:
        _answers_or_store_error(lambda: trial.selection(training_step=step))
    _answers_or_store_error(lambda: trial.series(node="x", role="x", iteration=0))
    assert set(trial.problems) <= {str(bad)}  # only the damaged file is ever skipped
    assert {0, 20} <= set(trial.steps()["training_step"].to_pylist())
    for step in (0, 20):  # the other steps' values still read
        assert trial.selection(training_step=step, node="y", columns=["mean"])["mean"].to_pylist() == [step + 1.0]
    assert_the_app_answers_cleanly(group_dir)


@pytest.mark.parametrize("value", [10**400, -10**400, 1.5, [1], True])
def test_a_filter_duckdb_cannot_bind_is_a_selection_error_not_a_damaged_chunk(group_dir: Path, value: Any) -> None:
    trial = GroupReader(group_dir).trial(TRIAL)
    with pytest.raises(ComgraError, match="64-bit integer"):
        trial.selection(training_step=0, iteration=value)
    assert trial.problems == []  # before the fix, every chunk the query touched was listed as damaged
    assert_rest_is_readable(trial)


def test_a_trial_folder_linked_from_outside_the_recording_is_refused(tmp_path: Path) -> None:
    outside = write_trial(tmp_path / "elsewhere")
    (tmp_path / "group" / fmt.TRIALS_DIR).mkdir(parents=True)
    (tmp_path / "group" / fmt.TRIALS_DIR / TRIAL).symlink_to(outside)
    group = GroupReader(tmp_path / "group")
    assert group.trials() == [TRIAL]  # listed, so that the app can say why it is not shown
    with pytest.raises(StoreError, match="outside the recording"):
        group.trial(TRIAL)
    assert_the_app_answers_cleanly(tmp_path / "group")

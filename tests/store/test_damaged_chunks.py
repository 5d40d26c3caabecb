"""Damaged files that used to answer silently (issue 21, items 8, 9 and 12).

Each test records a small trial with the real recorder, damages one of its files on disk (a flipped
byte, a retyped column, a FIFO, a link to itself or out of the recording) and checks that comgra's
reader, its scan loader and the app's service either return exactly what was recorded or leave the
file out and list it in ``problems``: never other values, never a hang, never a raw exception.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from comgra.errors import StoreError
from comgra.store import GroupReader, TrialReader
from comgra.store import format as fmt
from comgra.store import layout

torch = pytest.importorskip("torch")

GROUP, TRIAL = "group", "trial"
STEPS = (0, 1, 2, 3)


def record(root: Path, *, trial: str = TRIAL) -> Path:
    """Four recorded steps of a tiny model, through the documented loop; returns the group folder."""
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    generator = torch.Generator().manual_seed(7)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    recorder = ComgraRecorder(root, GROUP, trial, DecisionMakerForRecordingsHardcoded(set(STEPS)),
                              flush_seconds=60.0)
    recorder.track_module("model", model)
    for step in STEPS:
        recorder.start_batch(step, 3)
        recorder.start_iteration()
        x = torch.randn(3, 3, generator=generator)
        recorder.register_tensor("x", x, is_input=True)
        y = model(x)
        recorder.register_tensor("y", y)
        loss = y.pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.record_kpi_in_graph("loss", "main", float(loss.detach()))
        recorder.finish_batch()
    recorder.add_note("done")
    recorder.finalize()
    return root / GROUP


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    durable, fmt.DURABLE_WRITES = fmt.DURABLE_WRITES, False
    try:
        return record(tmp_path_factory.mktemp("recorded"))
    finally:
        fmt.DURABLE_WRITES = durable


@pytest.fixture
def group_dir(recorded: Path, tmp_path: Path) -> Path:
    """A fresh copy of the recording, to damage."""
    import shutil

    shutil.copytree(recorded, tmp_path / GROUP)
    return tmp_path / GROUP


def trial_dir(group_dir: Path) -> Path:
    return fmt.trial_dir(group_dir, TRIAL)


def open_trial(group_dir: Path) -> TrialReader:
    return GroupReader(group_dir).trial(TRIAL)


def chunk(group_dir: Path, table: str) -> Path:
    (path,) = fmt.chunk_files(layout.rank_dir(trial_dir(group_dir), table, 0))  # flush_seconds=60: one chunk per table
    return path


# -- what the reader answers, for comparing a damaged copy with the intact one --------------------------
def _sorted_rows(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=repr)


def every_answer(trial: TrialReader) -> dict[str, Any]:
    """Each way of reading a trial's values: selection per step, series, the scan's chunk reads, small tables."""
    from comgra.analysis.loading import read_chunk

    answers: dict[str, Any] = {f"selection {s}": _sorted_rows(trial.selection(training_step=s)) for s in STEPS}
    for node in ("x", "y"):
        answers[f"series {node}"] = trial.series(node=node, role=node, iteration=0).to_pylist()
    answers["scan"] = [_sorted_rows(read_chunk(trial, p).stats) for p in trial.tensor_chunks()]
    answers["steps"] = trial.steps().to_pylist()
    answers["kpis"] = trial.kpis().to_pylist()
    return answers


def _equal(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN (a recorded NaN is a value too)."""
    return repr(a) == repr(b)


def assert_exact_or_reported(damaged: Path, group_dir: Path, intact: dict[str, Any]) -> None:
    trial = open_trial(group_dir)
    answers = every_answer(trial)
    if str(damaged) in trial.problems:
        return  # left out, and said so
    wrong = [k for k in intact if not _equal(answers[k], intact[k])]
    assert not wrong, f"{damaged.name} answered other values without a report: {wrong}"


def column_bytes(path: Path, column: str) -> range:
    """The byte range of ``column``'s data in the first row group of a Parquet file."""
    metadata = pq.read_metadata(path)
    paths = [metadata.schema.column(i).path.split(".")[0] for i in range(metadata.num_columns)]
    index = paths.index(column)
    meta = metadata.row_group(0).column(index)
    start = meta.dictionary_page_offset or meta.data_page_offset
    return range(start, start + meta.total_compressed_size)


def flipped(path: Path, position: int, mask: int = 0x10) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


def silent_position(path: Path, column: str) -> int:
    """A byte of ``column``'s pages that, flipped, still decodes, to other values: only a checksum tells."""
    intact = pq.read_table(path)[column].to_pylist()
    broken = path.with_name("broken.bin")
    for position in column_bytes(path, column):
        data = bytearray(path.read_bytes())
        data[position] ^= 0x10
        broken.write_bytes(bytes(data))
        try:
            if pq.read_table(broken)[column].to_pylist() != intact:
                return position
        except (OSError, pa.ArrowException):
            continue
    raise AssertionError(f"no flip of {column} decodes silently")


# -- item 8: page checksums -----------------------------------------------------------------------------
@pytest.mark.parametrize(("table", "column"), [("tensors", "mean"), ("tensors", "neurons"), ("tensors", "node"),
                                               ("steps", "batch_size"), ("kpis", "value")])
def test_a_flipped_byte_in_a_page_is_reported_never_read_as_other_values(group_dir: Path, table: str,
                                                                         column: str) -> None:
    intact = every_answer(open_trial(group_dir))
    path = chunk(group_dir, table)
    original = path.read_bytes()
    span = column_bytes(path, column)
    # Every byte of the column's pages (the first 160 of a long one), one at a time.
    for position in list(span)[:160]:
        flipped(path, position)
        os.utime(path, ns=(0, position))  # a new version of the file for any cache keyed by mtime
        assert_exact_or_reported(path, group_dir, intact)
        path.write_bytes(original)


def test_chunks_are_written_with_page_checksums(group_dir: Path) -> None:
    """Where a flipped byte decodes to other values (zstd does not notice), the writer's CRCs do."""
    path = chunk(group_dir, "tensors")
    intact = pq.read_table(path)["mean"].to_pylist()
    silent = caught = 0
    broken = path.with_name("broken.bin")
    for position in column_bytes(path, "mean"):
        data = bytearray(path.read_bytes())
        data[position] ^= 0x01
        broken.write_bytes(bytes(data))
        try:
            if pq.read_table(broken)["mean"].to_pylist() == intact:
                continue
        except (OSError, pa.ArrowException):
            continue  # found without checksums too
        silent += 1
        with pytest.raises((OSError, pa.ArrowException), match="(?i)checksum"):
            pq.read_table(broken, page_checksum_verification=True)
        caught += 1
    assert silent > 0 and caught == silent


def test_a_failing_chunk_is_reported_by_the_app_and_the_other_chunks_still_read(group_dir: Path) -> None:
    from comgra.service import RecordingService

    path = chunk(group_dir, "tensors")
    flipped(path, silent_position(path, "mean"))
    service = RecordingService(group_dir)
    try:
        view = service.resolve({"trial": TRIAL, "training_step": 1})
        assert any("tensors" in b and "checksum" in b for b in view.banners + view.notices), view.banners
    finally:
        service.close()
    trial = open_trial(group_dir)
    assert trial.selection(training_step=1).num_rows == 0
    assert trial.problem_reasons() == {str(path): "damaged: a page fails its checksum (its values would be wrong)"}
    assert trial.steps()["training_step"].to_pylist() == list(STEPS)  # the index is another chunk, intact


def test_chunks_without_checksums_still_read(group_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    """A recording of an older comgra has no checksums: nothing to check, every value reads."""
    monkeypatch.setattr(fmt, "PAGE_CHECKSUMS", False)
    older = record(tmp_path / "older")
    intact = every_answer(open_trial(group_dir))
    answers = every_answer(open_trial(older))
    assert open_trial(older).problems == []
    for answer in (answers, intact):
        for row in answer["steps"] + answer["kpis"]:
            row.pop("wall_time")  # when each was recorded
    assert _equal(answers, intact)


# -- item 9: a chunk of the right names and the wrong types ---------------------------------------------
def _retyped(table: str, column: str, kind: pa.DataType) -> Callable[[Path], Path]:
    def damage(group_dir: Path) -> Path:
        path = chunk(group_dir, table)
        data = pq.read_table(path)
        index = data.schema.get_field_index(column)
        column_data = data[column]
        if pa.types.is_string(kind) or pa.types.is_list(kind) and pa.types.is_string(kind.value_type):
            values = pa.array([None if v is None else str(v) for v in column_data.to_pylist()], kind) \
                if pa.types.is_string(kind) else pa.array([[str(i) for i in v or []] for v in column_data.to_pylist()],
                                                          kind)
        else:
            values = pc.cast(column_data, kind, safe=False)
        pq.write_table(data.set_column(index, pa.field(column, kind), values), path)
        return path
    return damage


RETYPED = {
    "tensors mean as float64": _retyped("tensors", "mean", pa.float64()),
    "tensors mean as string": _retyped("tensors", "mean", pa.string()),
    "tensors training_step as int32": _retyped("tensors", "training_step", pa.int32()),
    "tensors training_step as float64": _retyped("tensors", "training_step", pa.float64()),
    "tensors neurons as float64 lists": _retyped("tensors", "neurons", pa.list_(pa.float64())),
    "tensors nan_count as int64": _retyped("tensors", "nan_count", pa.int64()),
    "steps training_step as string": _retyped("steps", "training_step", pa.string()),
    "steps iteration as float64": _retyped("steps", "iteration", pa.float64()),
    "steps batch_size as int64": _retyped("steps", "batch_size", pa.int64()),
    "kpis value as float32": _retyped("kpis", "value", pa.float32()),
    "kpis timepoint as string": _retyped("kpis", "timepoint", pa.string()),
}


@pytest.mark.parametrize("case", RETYPED)
def test_a_chunk_with_the_right_names_and_wrong_types_is_reported(group_dir: Path, case: str) -> None:
    bad = RETYPED[case](group_dir)
    trial = open_trial(group_dir)
    every_answer(trial)  # no exception, whatever path reads the chunk
    assert list(trial.problems) == [str(bad)], case
    assert "not a chunk of this table" in trial.problem_reasons()[str(bad)]
    table = layout.table_of_chunk(bad)
    if table == "tensors":
        assert all(trial.selection(training_step=s).num_rows == 0 for s in STEPS)
        assert trial.series(node="x", role="x", iteration=0).num_rows == 0
    else:
        assert getattr(trial, table)().num_rows == 0


def test_a_series_reports_a_retyped_chunk_first_read_by_the_series(group_dir: Path) -> None:
    """The series route reads row groups itself (not through DuckDB): it checks the schema too."""
    bad = RETYPED["tensors mean as float64"](group_dir)
    trial = open_trial(group_dir)
    assert trial.series(node="y", role="y", iteration=0).num_rows == 0
    assert trial.problems == [str(bad)]


# -- item 12: files that are not regular, links that loop or leave the trial ----------------------------
def _run_with_deadline(call: Callable[[], Any], seconds: float = 10.0) -> Any:
    """``call()`` on a daemon thread; fails (instead of hanging the test run) if it does not return in time."""
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["value"] = call()
        except BaseException as error:  # noqa: BLE001 - re-raised below
            result["error"] = error

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still blocked after {seconds} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


def _fifo_chunk(table: str) -> Callable[[Path], Path]:
    def damage(group_dir: Path) -> Path:
        path = layout.rank_dir(trial_dir(group_dir), table, 0) / fmt.chunk_name(99, 0, 3)
        os.mkfifo(path)
        return path
    return damage


def _self_link_chunk(table: str) -> Callable[[Path], Path]:
    def damage(group_dir: Path) -> Path:
        path = layout.rank_dir(trial_dir(group_dir), table, 0) / fmt.chunk_name(99, 0, 3)
        path.symlink_to(path.name)
        return path
    return damage


def _dangling_link_chunk(group_dir: Path) -> Path:
    path = layout.rank_dir(trial_dir(group_dir), "tensors", 0) / fmt.chunk_name(99, 0, 3)
    path.symlink_to("nothing-here.parquet")
    return path


def _folder_named_like_a_chunk(group_dir: Path) -> Path:
    path = layout.rank_dir(trial_dir(group_dir), "tensors", 0) / fmt.chunk_name(99, 0, 3)
    path.mkdir()
    return path


NOT_REGULAR = {
    "fifo tensors chunk": _fifo_chunk("tensors"),
    "fifo steps chunk": _fifo_chunk("steps"),
    "fifo kpis chunk": _fifo_chunk("kpis"),
    "tensors chunk linked to itself": _self_link_chunk("tensors"),
    "steps chunk linked to itself": _self_link_chunk("steps"),
    "dangling link": _dangling_link_chunk,
    "folder named like a chunk": _folder_named_like_a_chunk,
}


@pytest.mark.parametrize("case", NOT_REGULAR)
def test_a_chunk_that_is_no_regular_file_is_never_opened_and_reported(group_dir: Path, case: str) -> None:
    intact = every_answer(open_trial(group_dir))
    bad = NOT_REGULAR[case](group_dir)
    trial = open_trial(group_dir)
    answers = _run_with_deadline(lambda: every_answer(trial))
    assert answers == intact or all(_equal(answers[k], intact[k]) for k in intact)
    assert trial.problems == [str(bad)]


def test_a_fifo_graph_document_gives_a_store_error_without_blocking(group_dir: Path) -> None:
    trial = open_trial(group_dir)
    graph_hash = trial.steps()["graph"][0].as_py()
    path = trial_dir(group_dir) / "graphs" / f"{graph_hash}.json"
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(StoreError, match="not a regular file"):
        _run_with_deadline(lambda: open_trial(group_dir).graph(graph_hash))


def test_a_self_linked_graph_document_gives_a_store_error(group_dir: Path) -> None:
    trial = open_trial(group_dir)
    graph_hash = trial.steps()["graph"][0].as_py()
    path = trial_dir(group_dir) / "graphs" / f"{graph_hash}.json"
    path.unlink()
    path.symlink_to(path.name)
    with pytest.raises(StoreError, match=str(graph_hash)):
        _run_with_deadline(lambda: open_trial(group_dir).graph(graph_hash))


def test_trial_metadata_linked_out_of_the_recording_is_refused(group_dir: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    meta = trial_dir(group_dir) / fmt.TRIAL_META
    secret.write_bytes(meta.read_bytes())
    meta.unlink()
    meta.symlink_to(secret)
    with pytest.raises(StoreError, match="outside"):
        GroupReader(group_dir).trial(TRIAL)


def test_trial_metadata_as_a_fifo_neither_lists_nor_blocks(group_dir: Path) -> None:
    meta = trial_dir(group_dir) / fmt.TRIAL_META
    meta.unlink()
    os.mkfifo(meta)
    group = GroupReader(group_dir)
    assert _run_with_deadline(group.trials) == []


# -- random damage (hypothesis) ----------------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.sampled_from(["tensors", "steps", "kpis"]), at=st.floats(0, 1),
       flips=st.lists(st.integers(1, 255), min_size=1, max_size=4))
def test_random_flipped_bytes_are_exact_or_reported(recorded: Path, tmp_path_factory: pytest.TempPathFactory,
                                                    table: str, at: float, flips: list[int]) -> None:
    import shutil

    group_dir = tmp_path_factory.mktemp("flips") / GROUP
    shutil.copytree(recorded, group_dir)
    intact = every_answer(open_trial(group_dir))
    path = chunk(group_dir, table)
    data = bytearray(path.read_bytes())
    start = int((len(data) - 1) * at)
    for offset, mask in enumerate(flips):
        data[min(start + offset, len(data) - 1)] ^= mask
    path.write_bytes(bytes(data))
    assert_exact_or_reported(path, group_dir, intact)


KINDS = [pa.int8(), pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.string(), pa.bool_(),
         pa.list_(pa.float32()), pa.list_(pa.int64())]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.sampled_from(["tensors", "steps", "kpis"]), pick=st.integers(0, 100), kind=st.sampled_from(KINDS))
def test_any_column_retyped_is_exact_or_reported(recorded: Path, tmp_path_factory: pytest.TempPathFactory,
                                                 table: str, pick: int, kind: pa.DataType) -> None:
    """Any column of any chunk rewritten as another type: the reader, scan loader and service answer exactly
    what was recorded or leave the chunk out and list it; never a raw exception."""
    import shutil

    group_dir = tmp_path_factory.mktemp("retyped") / GROUP
    shutil.copytree(recorded, group_dir)
    intact = every_answer(open_trial(group_dir))
    path = chunk(group_dir, table)
    data = pq.read_table(path)
    column = data.column_names[pick % data.num_columns]
    if data.schema.field(column).type.equals(kind):
        return
    try:
        values = pc.cast(data[column], kind, safe=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        values = pa.nulls(data.num_rows, kind)
    pq.write_table(data.set_column(data.schema.get_field_index(column), pa.field(column, kind), values), path)
    assert_exact_or_reported(path, group_dir, intact)
    trial = open_trial(group_dir)
    every_answer(trial)
    assert trial.problems == [str(path)]

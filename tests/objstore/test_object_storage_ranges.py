"""Reading a large recording from S3 through range reads: a node click fetches the footers and the row groups of that
node, not the objects; every answer equals the local recording's, page checksums still checked."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from s3_faults import Faults, FaultyProxy

from comgra.store import GroupReader
from comgra.store.filesystems import open_location
from comgra.store.ranges import LAZY_BYTES, RECORDS, column_ranges, merged, missing
from comgra.store.uploader import Uploader

torch = pytest.importorskip("torch")

from comgra.objects import DecisionMakerForRecordingsFrequencyPerType  # noqa: E402
from comgra.recorder import ComgraRecorder  # noqa: E402

STEPS = 50


def wide_recording(root: Path) -> Path:
    """A trial whose finalized tensors chunk is over LAZY_BYTES: a 256-wide MLP, every neuron of a batch of 32 kept."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256), torch.nn.Tanh(),
                                torch.nn.Linear(256, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    recorder = ComgraRecorder(root, "g", "t", DecisionMakerForRecordingsFrequencyPerType(1))
    recorder.track_module("main", model)
    for step in range(STEPS):
        x = torch.randn(32, 32)
        recorder.start_batch(step, 32)
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        y = model(x)
        recorder.register_tensor("y", y)
        loss = y.pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    return root / "g"


def rows(table: Any) -> list[str]:
    return sorted(repr(tuple(row.values())) for row in table.to_pylist())  # repr: NaN equals NaN


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wide_recording(tmp_path_factory.mktemp("wide"))


def test_ranges_arithmetic() -> None:
    assert merged([(10, 20), (0, 5), (18, 30)]) == [(0, 5), (10, 30)]
    assert merged([(0, 5), (9, 12)], gap=4) == [(0, 12)]
    assert missing([(0, 100)], [(10, 20), (50, 60)]) == [(0, 10), (20, 50), (60, 100)]
    assert missing([(10, 20)], [(0, 100)]) == []


def test_a_node_click_on_a_large_s3_recording_fetches_far_fewer_bytes_than_the_object(
        wide: Path, s3_env: str, s3_server: str, tmp_path: Path, monkeypatch) -> None:
    url = f"{s3_env}/runs/g"
    Uploader(wide, open_location(url), journal_root=tmp_path / "journal").finish(120)
    chunks = sorted((wide / "tensors").rglob("*.parquet"))
    assert len(chunks) == 1 and chunks[0].stat().st_size > LAZY_BYTES, chunks
    size = chunks[0].stat().st_size
    proxy = FaultyProxy(s3_server, Faults())  # no faults: it counts the bytes each request was answered with
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        remote, local = GroupReader(url), GroupReader(wide)
        opened = proxy.faults.sent["GET"]
        a, b = remote.trial("t"), local.trial("t")
        assert a.steps().to_pylist() == b.steps().to_pylist()
        listed = proxy.faults.sent["GET"]
        # The mirror holds a sparse copy: the object's size and time, its footer, no data.
        copy = remote.path / chunks[0].relative_to(wide)
        assert copy.stat().st_size == size and (remote.path / RECORDS / chunks[0].relative_to(wide)).is_file()
        assert opened < size / 4, (opened, size)

        # A node click: that node's rows of one step and its series across the steps.
        node = "y"  # the output: its rows lie in a few of the chunk's row groups (rows are sorted by node)
        clicked = rows(a.selection(training_step=7, node=node))
        assert clicked and clicked == rows(b.selection(training_step=7, node=node))
        series = dict(node=node, role=node, iteration=0, aggregation="mean", statistic="abs_max")
        assert a.series(**series).num_rows == STEPS
        assert rows(a.series(**series)) == rows(b.series(**series))
        click = proxy.faults.sent["GET"] - listed
        assert 0 < click < size / 3, (click, size)
        # The footer's own account: the bytes of that node's row groups, far from all of them.
        metadata = pq.read_metadata(chunks[0])
        groups = a._series_reader.row_groups_of(copy, node)
        assert len(groups) < metadata.num_row_groups
        assert click >= sum(end - start for start, end in merged(column_ranges(metadata, groups, ["neurons"])))

        # Asked again: answered from the sparse copy, nothing fetched.
        before = proxy.faults.sent["GET"]
        assert a.selection(training_step=7, node=node).num_rows == len(clicked)
        assert proxy.faults.sent["GET"] == before

        # Every other answer (other steps, whole chunk reads of a scan) fills the rest and equals the local one.
        for step in (0, 25, STEPS - 1):
            assert rows(a.selection(training_step=step)) == rows(b.selection(training_step=step))
        assert rows(a.read_tensor_chunk(copy)) == rows(b.read_tensor_chunk(chunks[0]))
        assert a.problems == [] and b.problems == []
        assert proxy.faults.sent["GET"] - opened < 1.2 * size  # each byte fetched about once
        assert copy.read_bytes() == chunks[0].read_bytes()
        assert not (remote.path / RECORDS / chunks[0].relative_to(wide)).exists()  # whole now: a plain file
    finally:
        proxy.close()


def test_a_damaged_page_in_a_sparse_copy_is_still_found(wide: Path, s3_env: str, tmp_path: Path) -> None:
    """Page checksums are checked on the ranges fetched: a flipped byte in the bucket's object is reported."""
    url = f"{s3_env}/runs/g"
    Uploader(wide, open_location(url), journal_root=tmp_path / "journal").finish(120)
    chunk = sorted((wide / "tensors").rglob("*.parquet"))[0]
    key = chunk.relative_to(wide).as_posix()
    data = bytearray(chunk.read_bytes())
    metadata = pq.read_metadata(chunk)
    start, end = merged(column_ranges(metadata, [0], ["mean"]))[0]
    data[(start + end) // 2] ^= 0xFF  # inside a data page of row group 0's statistics
    damaged = tmp_path / "damaged.parquet"
    damaged.write_bytes(bytes(data))
    time.sleep(0.01)
    open_location(url).upload(damaged, key)
    trial = GroupReader(url).trial("t")
    trial.selection(training_step=0)  # every row group's pages of every column: group 0's damaged one too
    assert any("checksum" in reason for reason in trial.problem_reasons().values()), trial.problem_reasons()


def test_a_mirror_that_needs_whole_files_replaces_the_sparse_copies(wide: Path, s3_env: str, tmp_path: Path) -> None:
    """``comgra repair URL`` rewrites files, so it mirrors every object whole, over the sparse copies a reader left in
    the same mirror folder."""
    from comgra.store.remote import Mirror

    url = f"{s3_env}/runs/g"
    Uploader(wide, open_location(url), journal_root=tmp_path / "journal").finish(120)
    chunk = sorted((wide / "tensors").rglob("*.parquet"))[0]
    key = chunk.relative_to(wide)
    reader = GroupReader(url)
    assert (reader.path / RECORDS / key).is_file() and (reader.path / key).read_bytes() != chunk.read_bytes()
    whole = Mirror.open(url, lazy_bytes=None)
    assert whole.local == reader.path
    assert (whole.local / key).read_bytes() == chunk.read_bytes() and not (whole.local / RECORDS / key).exists()


def test_a_streamed_scan_reads_sparse_copies_whole(wide: Path, s3_env: str, tmp_path: Path) -> None:
    """The streamed scan reads chunks with pyarrow itself: it asks for the whole chunk first, and gets the local rows."""
    from comgra.analysis.streaming import _chunk_parts

    url = f"{s3_env}/runs/g"
    Uploader(wide, open_location(url), journal_root=tmp_path / "journal").finish(120)
    chunk = sorted((wide / "tensors").rglob("*.parquet"))[0]
    a, b = GroupReader(url).trial("t"), GroupReader(wide).trial("t")
    copy = a.tensor_chunks()[0]
    assert copy.name == chunk.name and a._mirror.sparse.partial(copy)
    parts = list(_chunk_parts(a, copy))
    assert sum(part.num_rows for part in parts) == pq.read_metadata(chunk).num_rows
    assert sorted(r for part in parts for r in rows(part)) == sorted(r for part in _chunk_parts(b, chunk) for r in rows(part))
    assert a.problems == []

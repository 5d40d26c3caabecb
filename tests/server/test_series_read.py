"""A series (one statistic of one tensor over every step, the Graphs plot of a new tensor) reads only the row
groups that can hold its node, and its values are the store's, compared with every chunk read whole."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from comgra.store import layout
import pytest

from comgra.service import RecordingService, Selection, parse_aggregation
from comgra.store import GroupReader
from comgra.store import format as fmt


@pytest.fixture(scope="module")
def long_recording(tmp_path_factory, synthetic):
    """A transformer of 40 nodes, 60 recorded steps in chunks of 3: 16 merged into one chunk, 4 left as they
    are (several row groups each, a series in a few of them)."""
    return synthetic.write_recording(tmp_path_factory.mktemp("series"), synthetic.Options(
        scale=0.25, nodes=40, trials=1, steps_per_chunk=3, distinct_steps=4))


def _whole_chunks(trial) -> pa.Table:
    """Every row of every visible chunk, read whole with pyarrow (no statistics, no DuckDB)."""
    tables = []
    for path in trial.tensor_chunks():
        table = pq.read_table(path)
        if "rank" not in table.schema.names:  # format 3: the rank is the chunk's rank=<r> folder
            table = table.append_column("rank", pa.array([layout.rank_of_chunk(path)] * table.num_rows, pa.int32()))
        tables.append(table)
    return pa.concat_tables(tables)


def _expected(rows: pa.Table, node, role, kind, iteration, aggregation, sample, statistic) -> pa.Table:
    mask = np.ones(rows.num_rows, dtype=bool)
    for name, value in dict(node=node, role=role, kind=kind, iteration=iteration, aggregation=aggregation,
                            sample=sample).items():
        mask &= rows.column(name).to_numpy(zero_copy_only=False) == value
    chosen = rows.filter(pa.array(mask))
    order = np.argsort(chosen.column("training_step").to_numpy(), kind="stable")
    return chosen.take(pa.array(order)).select(["training_step", statistic, "rank"])


def _filters(key: tuple) -> dict:
    """A series key of ``_series_keys`` as the filters of ``SeriesReader.read`` (every rank)."""
    return dict(zip(("node", "role", "kind", "iteration", "aggregation", "sample"), key), rank=None)


def _series_keys(rows: pa.Table) -> list[tuple]:
    keys = rows.select(["node", "role", "kind", "iteration", "aggregation", "sample"]).group_by(
        ["node", "role", "kind", "iteration", "aggregation", "sample"]).aggregate([]).to_pylist()
    return [tuple(k.values()) for k in keys]


def test_every_series_equals_the_rows_of_the_whole_chunks(long_recording):
    trial = GroupReader(long_recording).trial(GroupReader(long_recording).trials()[0])
    assert any("-l1" in p.name for p in trial.tensor_chunks()) and len(trial.tensor_chunks()) >= 3
    rows = _whole_chunks(trial)
    keys = _series_keys(rows)
    assert len(keys) > 300
    for index, key in enumerate(keys):
        statistic = ("mean", "max", "abs_mean", "std", "min", "abs_max")[index % 6]
        got = trial.series(node=key[0], role=key[1], kind=key[2], iteration=key[3], aggregation=key[4],
                           sample=key[5], statistic=statistic)
        want = _expected(rows, *key, statistic)
        assert got.num_rows == want.num_rows == 60, key
        assert got.column("training_step").equals(want.column("training_step")), key
        assert np.array_equal(got.column("value").to_numpy(), want.column(statistic).to_numpy(), equal_nan=True), key


def test_a_series_reads_only_the_row_groups_of_its_node(long_recording, monkeypatch):
    trial = GroupReader(long_recording).trial(GroupReader(long_recording).trials()[0])
    total = sum(pq.read_metadata(p).num_row_groups for p in trial.tensor_chunks())
    read: list[int] = []
    original = pq.ParquetFile.read_row_groups
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups",
                        lambda self, groups, **kw: (read.extend(groups), original(self, groups, **kw))[1])
    table = trial.series(node="block0.fc1", role="block0.fc1", iteration=0, statistic="mean")
    assert table.num_rows == 60
    holding = 0  # row groups with a row of the node, counted from the rows of each chunk read whole
    for path in trial.tensor_chunks():
        size = pq.read_metadata(path).row_group(0).num_rows
        rows = np.flatnonzero(pq.read_table(path, columns=["node"]).column("node").to_numpy(zero_copy_only=False)
                              == "block0.fc1")
        holding += len(set(rows // size))
    assert len(read) == holding and holding <= total / 3, (len(read), holding, total)


def test_a_cancelled_series_read_stops_at_the_next_chunk(long_recording, monkeypatch):
    """``cancelled()`` turning true after the second chunk: ReadCancelled, and no third chunk is read (the
    app's series plot of a tensor the user has already left)."""
    from comgra.store.series_read import ReadCancelled

    trial = GroupReader(long_recording).trial(GroupReader(long_recording).trials()[0])
    assert len(trial.tensor_chunks()) >= 3
    read: list[str] = []
    original = pq.ParquetFile.read_row_groups
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups",
                        lambda self, groups, **kw: (read.append(groups), original(self, groups, **kw))[1])
    with pytest.raises(ReadCancelled, match="block0.fc1"):
        trial.series(node="block0.fc1", role="block0.fc1", iteration=0, cancelled=lambda: len(read) >= 2)
    assert len(read) == 2
    whole = trial.series(node="block0.fc1", role="block0.fc1", iteration=0, cancelled=lambda: False)
    assert whole.num_rows == 60


def test_the_parsed_footers_kept_stay_within_the_budget(long_recording):
    """A budget of two footers: two are kept (the first met), the rest are parsed again when read, and
    every series still equals the rows of the whole chunks; without a budget, one footer per chunk."""
    from comgra.store.series_read import PARSED_FOOTER_FACTOR, SeriesReader

    trial = GroupReader(long_recording).trial(GroupReader(long_recording).trials()[0])
    paths = trial.tensor_chunks()
    sizes = [pq.read_metadata(p).serialized_size * PARSED_FOOTER_FACTOR for p in paths]
    assert len(paths) >= 3
    rows = _whole_chunks(trial)
    empty = rows.schema.empty_table().select(["training_step", "max"])  # format 3 files hold no rank column
    for budget, kept in ((sizes[0] + sizes[1], 2), (0, 0), (sum(sizes), len(paths))):
        reader = SeriesReader(footer_budget=budget, keep_from=0)
        for key in _series_keys(rows)[::97][:3]:
            filters = _filters(key)
            got = reader.read(paths, ["training_step", "max"], filters, empty)
            want = _expected(rows, *key, "max")
            assert got.num_rows == want.num_rows == 60, (budget, key)
            assert sorted(got.column("training_step").to_pylist()) == want.column("training_step").to_pylist()
            assert np.array_equal(got.column("max").to_numpy(), want.column("max").to_numpy(), equal_nan=True)
            assert reader.kept_footer_bytes <= budget and len(reader._parsed) == kept, (budget, key)
    reader.forget_all_but(paths[1:])
    assert len(reader._parsed) == len(paths) - 1 and reader.kept_footer_bytes == sum(sizes[1:])


def test_a_damaged_chunk_is_reported_and_the_rest_of_the_series_is_read(tmp_path, synthetic):
    group = synthetic.write_recording(tmp_path, synthetic.Options(scale=0.1, nodes=40, trials=1, steps_per_chunk=4))
    trial = GroupReader(group).trial(GroupReader(group).trials()[0])
    chunks = trial.tensor_chunks()
    before = trial.series(node="block0.q", role="block0.q", iteration=0)  # footers now kept
    chunks[1].write_bytes(b"not parquet")
    after = trial.series(node="block0.q", role="block0.q", iteration=0)
    assert str(chunks[1]) in trial.problems
    lost = set(before.column("training_step").to_pylist()) - set(after.column("training_step").to_pylist())
    first, last = fmt.step_range_of(chunks[1].name)
    assert lost == {s for s in before.column("training_step").to_pylist() if first <= s <= last} != set()


def test_the_plotted_series_of_the_service_is_the_store_s(long_recording):
    service = RecordingService(long_recording)
    trial_id = service.group.trials()[0]
    rows = _whole_chunks(service.trial(trial_id))
    view = service.resolve({"trial": trial_id, "node_id": "block0.attention", "aggregation": "sample:2"})
    selection: Selection = view.selection
    assert (selection.node, selection.aggregation) == ("block0.attention", "sample:2") and not view.notices
    steps, values = service.statistic_series(trial_id, selection, "abs_max")
    aggregation, sample = parse_aggregation(selection.aggregation)
    want = _expected(rows, selection.node, selection.role, selection.kind, selection.data_iteration, aggregation,
                     sample, "abs_max")
    assert np.array_equal(steps, want.column("training_step").to_numpy())
    assert np.array_equal(values, want.column("abs_max").to_numpy().astype(np.float64))
    assert pc.max(want.column("abs_max")).as_py() > 0


def test_the_kept_series_are_bounded_in_bytes(long_recording, monkeypatch):
    """A live run's series grow with it: the answers kept are bounded in bytes, not only in number (issue 31
    item 13); the latest answer is always kept."""
    from comgra.service import steps as step_module

    service = RecordingService(long_recording)
    trial_id = service.group.trials()[0]
    selection = service.resolve({"trial": trial_id, "node_id": "block0.attention"}).selection
    first = service.statistic_series(trial_id, selection, "abs_max")
    one = first[0].nbytes + first[1].nbytes
    monkeypatch.setattr(step_module, "SERIES_CACHE_BYTES", int(2.5 * one))
    for statistic in ("mean", "std", "max", "min"):
        last = service.statistic_series(trial_id, selection, statistic)
    kept = service.step_reads._series
    assert 1 <= len(kept) <= 2 and sum(s.nbytes + v.nbytes for s, v in kept.values()) <= 2.5 * one
    assert any(answer is last for answer in kept.values())
    service.close()


def test_only_large_footers_are_kept_parsed(long_recording):
    """A live run writes many small chunks: their footers, kept parsed, grew with it (ten times their size on disk).
    Only a footer of at least ``KEEP_PARSED_FROM_BYTES`` on disk, costly to parse again, is kept; the series is the
    same either way."""
    from comgra.store.series_read import KEEP_PARSED_FROM_BYTES, PARSED_FOOTER_FACTOR, SeriesReader

    trial = GroupReader(long_recording).trial(GroupReader(long_recording).trials()[0])
    paths = trial.tensor_chunks()
    sizes = [pq.read_metadata(p).serialized_size for p in paths]
    rows = _whole_chunks(trial)
    empty = rows.schema.empty_table().select(["training_step", "max"])
    cut = sorted(sizes)[len(sizes) // 2]  # the larger half of this recording's footers stand for large ones
    key = _series_keys(rows)[0]
    filters = _filters(key)
    for keep_from, kept in ((cut, [s for s in sizes if s >= cut]), (KEEP_PARSED_FROM_BYTES,
                                                                     [s for s in sizes if s >= KEEP_PARSED_FROM_BYTES])):
        reader = SeriesReader(keep_from=keep_from)
        got = reader.read(paths, ["training_step", "max"], filters, empty)
        assert got.num_rows == _expected(rows, *key, "max").num_rows == 60
        assert len(reader._parsed) == len(kept) and reader.kept_footer_bytes == PARSED_FOOTER_FACTOR * sum(kept)
        assert reader.read(paths, ["training_step", "max"], filters, empty).equals(got)  # parsed again: the same
    trial.series(node=key[0], role=key[1], kind=key[2], iteration=key[3])  # the reader's own: small ones not kept
    assert trial._series_reader.kept_footer_bytes == PARSED_FOOTER_FACTOR * sum(
        s for s in sizes if s >= KEEP_PARSED_FROM_BYTES)


def test_a_series_asked_again_reads_only_the_chunks_written_since(long_recording):
    """A live run's series is asked again and again while chunks are added and merged: each chunk's rows are kept per
    series (a chunk never changes), so a request reads only the new chunks, and the answer is the one a reader that
    kept nothing gives (issue 31 item 13: every request read every chunk, work that grew with the run)."""
    from comgra.store.series_read import SeriesReader

    trial = GroupReader(long_recording).trial(GroupReader(long_recording).trials()[0])
    paths = trial.tensor_chunks()
    rows = _whole_chunks(trial)
    empty = rows.schema.empty_table().select(["training_step", "max"])
    keys = _series_keys(rows)[::53][:4]
    reader = SeriesReader()
    for grown in range(1, len(paths) + 1):  # the chunks as they appear
        for key in keys:
            filters = _filters(key)
            before = reader.chunks_read
            got = reader.read(paths[:grown], ["training_step", "max"], filters, empty)
            assert got.equals(SeriesReader(memo_budget=0).read(paths[:grown], ["training_step", "max"], filters, empty))
            new_holding = int(bool(reader.row_groups_of(paths[grown - 1], key[0])))  # the one new chunk has the node
            assert reader.chunks_read - before == new_holding, (grown, key)
    whole = reader.read(paths, ["training_step", "max"], filters, empty)
    assert whole.num_rows == 60 and reader.kept_series_bytes > 0
    reader.forget_all_but(paths[1:])  # the first chunk merged away: its parts are let go
    assert all(all(version[0] != str(paths[0]) for version in parts) for parts in reader._memo.values())


def test_the_kept_series_rows_stay_within_their_budget(long_recording):
    """Past the budget the least recently read series is let go; the answers stay the store's."""
    from comgra.store.series_read import SeriesReader

    trial = GroupReader(long_recording).trial(GroupReader(long_recording).trials()[0])
    paths = trial.tensor_chunks()
    rows = _whole_chunks(trial)
    empty = rows.schema.empty_table().select(["training_step", "max"])
    keys = _series_keys(rows)[::41][:6]
    one = SeriesReader()
    filters = _filters(keys[0])
    one.read(paths, ["training_step", "max"], filters, empty)
    budget = int(2.5 * one.kept_series_bytes)
    reader = SeriesReader(memo_budget=budget)
    for key in keys:
        filters = _filters(key)
        got = reader.read(paths, ["training_step", "max"], filters, empty)
        want = _expected(rows, *key, "max")
        assert sorted(got.column("training_step").to_pylist()) == want.column("training_step").to_pylist()
        assert 0 < reader.kept_series_bytes <= budget and len(reader._memo) <= 2
    assert next(reversed(reader._memo))[1] == tuple(sorted({k: v for k, v in filters.items() if v is not None}.items()))

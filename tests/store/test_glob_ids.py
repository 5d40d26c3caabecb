"""Trial ids and group paths are names, never patterns: each trial reads back exactly its own rows.

DuckDB reads every path handed to read_parquet as a glob, so before the fix a trial named
``run[12]`` showed ``run1``'s values and ``run*`` the rows of every trial.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from comgra.capture.options import RecorderOptions
from comgra.errors import ConfigError
from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.store import GroupReader
from comgra.store import format as fmt
from comgra.store.writer import ChunkWriter

# Heavy in the characters globs, SQL and shells treat specially, so that generated ids often match each other.
ALPHABET = "r1 2*?[]{},!^-'\"=.é€😀"
trial_ids = st.text(ALPHABET, min_size=1, max_size=6).filter(lambda s: not s.startswith("."))


def recorder_accepts(trial_id: str) -> bool:
    try:
        _options(trial_id)
    except ConfigError:
        return False
    return True


def _options(trial_id: str, group: str = "group") -> RecorderOptions:
    return RecorderOptions.create(
        root="/nonexistent", group=group, trial_id=trial_id, policy=DecisionMakerForRecordingsHardcoded({0}),
        max_samples=None, visual_prefixes=None, node_prefixes=None, active=True, with_svd=False,
        max_neurons=4, flush_seconds=1.0)


def _row(step: int, value: float) -> dict:
    return {"training_step": step, "kind": "forward", "iteration": 0, "node": "x", "role": "x", "tensor_name": "x",
            "tensor_type": "calculated", "aggregation": "mean", "sample": -1, "category": None, "shape": [2],
            **dict.fromkeys(fmt.STATISTICS, value), "svd_max": None, "num_neurons": 1, "neurons": [value]}


def write_trial(group_dir: Path, trial_id: str, value: float) -> None:
    """Steps 0 and 1, with ``value`` and ``value + 0.5`` as every statistic: the trial's fingerprint."""
    directory = fmt.trial_dir(group_dir, trial_id)
    fmt.write_json_atomic(directory / fmt.TRIAL_META, {"format_version": fmt.FORMAT_VERSION, "trial_id": trial_id})
    writer = ChunkWriter(directory, flush_seconds=60.0)
    for step in (0, 1):
        writer.put_table("tensors", pa.Table.from_pylist([_row(step, value + step / 2)], schema=fmt.TENSORS_SCHEMA))
        writer.flush()
    writer.close()
    assert writer.error is None


def assert_each_reads_its_own_rows(group_dir: Path, ids: list[str]) -> None:
    group = GroupReader(group_dir)
    try:
        assert group.trials() == sorted(ids)
        for value, trial_id in enumerate(ids):
            trial = group.trial(trial_id)
            for step in (0, 1):
                rows = trial.selection(training_step=step, columns=["mean"])
                assert rows["mean"].to_pylist() == [value + step / 2], (trial_id, step)
            series = trial.series(node="x", role="x", iteration=0)
            assert series["training_step"].to_pylist() == [0, 1], trial_id
            assert series["value"].to_pylist() == [value, value + 0.5], trial_id
            assert trial.problems == [], trial_id
    finally:
        group.close()


@pytest.mark.parametrize("ids", [
    ["run1", "run2", "run[12]"],
    ["trial_main_b", "trial_[m]ain_b"],
    ["lr=1e-3 a", "lr=1e-3 [a]"],
    ["run1", "run2", "run*", "run?"],
    ["run[!1]", "run[^1]", "run0"],
    ["a{b,c}", "ab", "ac"],
    ["q'x", 'q"x', "q,x", "sp ace", "ü€", "[", "]", "[]", "**", "x**y"],
])
def test_glob_characters_in_trial_ids_read_only_their_own_rows(tmp_path: Path, ids: list[str]) -> None:
    assert all(recorder_accepts(i) for i in ids)
    for value, trial_id in enumerate(ids):
        write_trial(tmp_path / "group", trial_id, float(value))
    assert_each_reads_its_own_rows(tmp_path / "group", ids)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(trial_ids, min_size=2, max_size=4, unique=True))
def test_any_id_the_recorder_accepts_reads_back_exactly_its_own_rows(tmp_path: Path, ids: list[str]) -> None:
    ids = [i for i in ids if recorder_accepts(i)]
    group_dir = tmp_path / "group"
    shutil.rmtree(group_dir, ignore_errors=True)
    for value, trial_id in enumerate(ids):
        write_trial(group_dir, trial_id, float(value))
    assert_each_reads_its_own_rows(group_dir, ids)


@pytest.mark.parametrize("root", ["root", "root [a]"])
@pytest.mark.parametrize("group", ["g[1]", "g*", "g?", "g{1,2}", "g [1] é"])
def test_glob_characters_in_the_group_path_are_plain_characters(tmp_path: Path, root: str, group: str) -> None:
    for sibling, value in ((group, 0.0), ("g1", 7.0), ("g2", 8.0), ("gx", 9.0)):  # siblings a pattern would match
        write_trial(tmp_path / root / sibling, "run", value)
    assert_each_reads_its_own_rows(tmp_path / root / group, ["run"])


@pytest.mark.parametrize("trial_id", ["a\0b", "x" * 256, "é" * 128, "\ud800"])
def test_ids_the_filesystem_cannot_hold_are_refused_by_the_recorder(trial_id: str) -> None:
    with pytest.raises(ConfigError, match="trial_id"):
        _options(trial_id)

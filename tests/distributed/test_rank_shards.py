"""Ranks without coordination: rank discovery, record_ranks, and each rank moving aside only its own files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from comgra.capture.ranks import RankInfo, discover_rank
from comgra.errors import ConfigError
from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder
from comgra.store import GroupReader
from comgra.store import format as fmt
from comgra.store import layout

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("environ, expected", [
    ({}, RankInfo(0, 1)),
    ({"RANK": "3", "WORLD_SIZE": "4"}, RankInfo(3, 4)),
    ({"RANK": "2"}, RankInfo(2, 3)),  # no world size: at least rank + 1
    ({"RANK": "x", "WORLD_SIZE": "y"}, RankInfo(0, 1)),
])
def test_rank_from_torchrun_environment(environ: dict[str, str], expected: RankInfo) -> None:
    assert discover_rank(environ) == expected


def _recorder(root: Path, monkeypatch: pytest.MonkeyPatch, rank: int, world_size: int, **options: object) -> ComgraRecorder:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    return ComgraRecorder(root, "group", "trial", DecisionMakerForRecordingsHardcoded({0}), flush_seconds=60.0,
                          **options)  # type: ignore[arg-type]


def _record_one_step(recorder: ComgraRecorder, value: float) -> None:
    recorder.start_batch(0, 2)
    recorder.start_iteration()
    x = torch.full((2, 3), value)
    recorder.register_tensor("x", x, is_input=True)
    recorder.register_tensor("y", x * 2)
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()


@pytest.mark.parametrize("value", ["one", [], [0, -1], [True], 3, None])
def test_record_ranks_must_be_all_zero_or_ranks(tmp_path: Path, value: object) -> None:
    with pytest.raises(ConfigError, match="record_ranks="):
        ComgraRecorder(tmp_path, "group", "trial", DecisionMakerForRecordingsHardcoded({0}),
                       record_ranks=value)  # type: ignore[arg-type]


def test_a_rank_that_does_not_record_costs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = _recorder(tmp_path, monkeypatch, 1, 2, record_ranks="zero")
    assert not recorder.comgra_is_active and recorder.session is None
    _record_one_step(recorder, 1.0)
    assert not (tmp_path / "group").exists()


def test_the_lowest_recording_rank_writes_trial_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With rank 0 left out, the trial must still exist for the reader (it lists trials by trial.json)."""
    _record_one_step(_recorder(tmp_path, monkeypatch, 1, 3, record_ranks=[1, 2]), 1.0)
    _record_one_step(_recorder(tmp_path, monkeypatch, 2, 3, record_ranks=[1, 2]), 2.0)
    trial = tmp_path / "group" / "trials" / "trial"
    assert (trial / fmt.TRIAL_META).is_file() and (trial / "rank-002.json").is_file()
    assert GroupReader(tmp_path / "group").trial("trial").ranks() == [1, 2]


def _files(trial: Path) -> set[str]:
    return {str(p.relative_to(trial)) for p in trial.rglob("*") if p.is_file() and not p.name.startswith(".")}


def test_each_rank_moves_aside_only_its_own_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rerun of a 2-rank trial: rank 1 starting first must not lose rank 0's files, nor the other way round."""
    trial = tmp_path / "group" / "trials" / "trial"
    for rank in (0, 1, 2):  # rank 2: an earlier run had three ranks
        _record_one_step(_recorder(tmp_path, monkeypatch, rank, 3), float(rank))
    earlier = _files(trial)
    assert {"rank-001.json", "rank-002.json", "trial.json"} <= earlier

    second = _recorder(tmp_path, monkeypatch, 1, 2)  # rank 1 of the new 2-rank run opens first
    left = _files(trial)
    assert not any("-r001-" in name for name in left) and "rank-001.json" in left  # its own new metadata
    assert {n for n in earlier if "-r000-" in n or "-r002-" in n or n == "trial.json"} <= left  # not its to move
    _record_one_step(second, 10.0)
    first = _recorder(tmp_path, monkeypatch, 0, 2)
    _record_one_step(first, 20.0)
    now = _files(trial)
    assert not any("-r002-" in name for name in now) and "rank-002.json" not in now  # leftovers: rank 0's to move
    assert any(name.startswith("graphs/") for name in now)
    reader = GroupReader(tmp_path / "group").trial("trial")
    assert reader.ranks() == [0, 1] and reader.metadata["world_size"] == 2
    means = {r: reader.selection(training_step=0, node="x", kind="forward", aggregation="mean", rank=r)["mean"]
             .to_pylist() for r in (0, 1)}
    assert means == {0: [20.0], 1: [10.0]}
    moved = list((tmp_path / "group" / ".replaced").iterdir())
    assert len(moved) == 2 and all("-r00" in folder.name for folder in moved)


def test_a_single_process_rerun_moves_the_whole_trial_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for value in (1.0, 2.0):
        _record_one_step(ComgraRecorder(tmp_path, "group", "trial", DecisionMakerForRecordingsHardcoded({0}),
                                        flush_seconds=60.0), value)
    # One process made both: the earlier run is kept whole, as trial~1 (capture.open_recorders; another process's
    # earlier run moves to .replaced/ whole: tests/capture/test_session.py)
    moved = tmp_path / "group" / "trials" / "trial~1"
    assert (moved / "trial.json").is_file() and (moved / "graphs").is_dir() and any((layout.rank_dir(moved, "tensors", 0)).iterdir())
    trial = tmp_path / "group" / "trials" / "trial"
    assert "world_size" not in json.loads((trial / "trial.json").read_text())

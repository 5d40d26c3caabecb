"""The ranks of a torch.distributed run in the service and the app: one rank, or all side by side.

Uses the golden 2-rank recording (tests/golden/make_format_v2.py): x = arange(6).reshape(3, 2)
+ 100 * step + 1000 * rank, so the batch mean of x is 2.5 + 100 * step + 1000 * rank.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from comgra.server.view_state import ALL_RANKS, next_wanted, rank_outputs
from comgra.server.figures import series_figure
from comgra.service import RecordingService, series

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


@pytest.fixture(scope="module")
def service() -> Iterator[RecordingService]:
    service = RecordingService(GOLDEN / "format_v2" / "golden_group")
    yield service
    service.close()


def test_the_lowest_rank_is_shown_by_default(service: RecordingService) -> None:
    view = service.resolve({"node_id": "x"})
    assert view.choices.ranks == [0, 1]
    assert view.selection is not None and view.selection.rank == 0
    assert view.row is not None and view.row["mean"] == 2.5 and view.row["rank"] == 0
    assert view.choices.steps == [0, 2] and view.choices.iterations == [0]  # one rank's index: no step twice


@pytest.mark.parametrize("step, mean", [(0, 1002.5), (2, 1202.5)])
def test_a_chosen_rank_shows_its_own_values(service: RecordingService, step: int, mean: float) -> None:
    view = service.resolve({"node_id": "x", "rank": 1, "training_step": step})
    assert view.selection is not None and (view.selection.rank, view.selection.training_step) == (1, step)
    assert view.row is not None and view.row["mean"] == mean and view.notices == []


@pytest.mark.parametrize("rank", [7, -1])
def test_a_rank_that_did_not_record_falls_back_with_a_notice(service: RecordingService, rank: int) -> None:
    view = service.resolve({"node_id": "x", "rank": rank})
    assert view.selection is not None and view.selection.rank == 0
    assert any(repr(rank) in notice for notice in view.notices)


def test_the_series_has_one_line_per_rank_when_all_ranks_are_asked_for(service: RecordingService) -> None:
    selection = service.resolve({"node_id": "x", "rank": 1}).selection
    assert selection is not None
    (one,) = series(service, selection, "mean")
    assert one.rank is None and one.values.tolist() == [1002.5, 1202.5]
    lines = series(service, selection, "mean", all_ranks=True)
    assert [(line.rank, line.steps.tolist(), line.values.tolist()) for line in lines] == [
        (0, [0, 2], [2.5, 202.5]), (1, [0, 2], [1002.5, 1202.5])]
    names = [trace.name for trace in series_figure(lines, title="t", current_trial="golden_trial",
                                                   current_step=0).data]
    assert names == ["golden_trial · rank 0", "golden_trial · rank 1"]


def test_a_single_process_recording_has_one_rank_and_no_rank_selector() -> None:
    service = RecordingService(GOLDEN / "format_v1" / "golden_group")
    try:
        view = service.resolve({})
        assert view.choices.ranks == [0] and view.selection is not None and view.selection.rank == 0
        assert rank_outputs(view.choices.ranks, view.selection, False)["rank_box"].endswith("d-none")
    finally:
        service.close()


def test_the_rank_selector_offers_every_rank_and_all(service: RecordingService) -> None:
    view = service.resolve({"rank": 1})
    outputs = rank_outputs(view.choices.ranks, view.selection, False)
    assert [o["value"] for o in outputs["rank_options"]] == [0, 1, ALL_RANKS]
    assert outputs["rank"] == 1 and "d-none" not in outputs["rank_box"]
    assert rank_outputs(view.choices.ranks, view.selection, True)["rank"] == ALL_RANKS


@pytest.mark.parametrize("start, value, expected", [
    ({"rank": 0, "all_ranks": True}, 1, {"rank": 1}),  # one rank again: no longer all
    ({"rank": 1}, ALL_RANKS, {"rank": 1, "all_ranks": True}),
    ({"rank": 1}, True, {"rank": 1}),  # not a rank: ignored
])
def test_choosing_a_rank_is_a_wish(service: RecordingService, start: dict, value: object, expected: dict) -> None:
    shown = service.resolve({"rank": 1}).selection.to_dict()  # type: ignore[union-attr]
    wanted, _ = next_wanted(service, start, shown, "rank", {"rank": value})
    assert wanted == expected

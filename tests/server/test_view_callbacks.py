"""The view callback's pure parts: what the user asks for next, what is remembered, slider marks."""
from __future__ import annotations

import pytest

from comgra.server import tensors, view_state
from comgra.server.view_state import next_wanted, remember, slider_marks, view_outputs
from comgra.service import ANY_TYPE, RecordingService


@pytest.fixture(scope="module")
def service(recording) -> RecordingService:
    return RecordingService(recording)


@pytest.fixture(scope="module")
def shown(service) -> dict:
    return service.resolve({}).selection.to_dict()


@pytest.mark.parametrize("trigger, value, expected", [
    ("trial", "t2", {"trial": "t2"}),
    ("kind", "gradients", {"kind": "gradients"}),
    ("type", "05_iterations", {"type_of_execution": "05_iterations"}),
    ("iteration", 3, {"iteration": 3}),
    ("aggregation", "sample:2", {"aggregation": "sample:2"}),
    ("node_click", {"id": "output", "t": 1}, {"node_id": "output"}),
    ("search", "loss", {"node_id": "loss"}),
    ("step_input", 120, {"training_step": 120}),
    ("role", "r1", {"roles": {"input": "r1"}}),
    ("role", "input", {}),  # the shown role again: nothing new
    ("version", "x", {}),
    (None, None, {}),
    ("search", None, {}),  # clearing the search box changes nothing
])
def test_an_input_changes_one_wish(service, shown, trigger, value, expected):
    inputs = {**current_inputs(shown), **({trigger: value} if trigger else {})}
    wanted, move = next_wanted(service, {}, shown, trigger, inputs)
    assert wanted == expected and move is None


def current_inputs(shown: dict) -> dict:
    """The selector values the browser holds right after showing ``shown``."""
    return {"trial": shown["trial"], "kind": shown["kind"], "type": shown["type_of_execution"],
            "iteration": shown["iteration"], "aggregation": shown["aggregation"], "role": shown["role"]}


def test_a_choice_whose_answer_has_not_arrived_is_not_lost(service, shown):
    inputs = {**current_inputs(shown), "aggregation": "sample:3", "node_click": {"id": "output", "t": 2}}
    wanted, _ = next_wanted(service, {}, shown, "node_click", inputs)
    assert wanted == {"aggregation": "sample:3", "node_id": "output"}


def test_a_link_opens_the_view_it_names_and_the_view_writes_its_link(service):
    view = service.resolve({"node_id": "subnet_mem__out", "aggregation": "sample:2", "kind": "gradients"})
    link = view_state.link_of(view)
    wanted = view_state.linked_wanted("url", link.split("/", 1)[1])
    again = service.resolve(wanted)
    assert again.selection == view.selection and not again.notices
    assert view_state.linked_wanted("url", "") is None  # no query: the inputs decide
    assert view_state.linked_wanted("node_click", link) is None  # only at page load


def test_a_node_click_sends_the_graph_only_once_per_hash(service):
    view = service.resolve({"node_id": "output"})
    first = view_outputs(view, {}, None, known=[])
    assert first["graph_key"] == {"trial": view.trial, "hash": view.graph["hash"]}
    assert first["graphs"] is not view_state.no_update
    again = view_outputs(service.resolve({"node_id": "input"}), {}, None, known=[view.graph["hash"]])
    assert again["graphs"] is view_state.no_update and again["graphs_known"] is view_state.no_update


def test_notices_go_to_the_selector_they_concern(service):
    view = service.resolve({"node_id": "subnet_pre", "aggregation": "sample:3", "training_step": 10**6})
    topics = view_state.notices_by_topic(view.notices)
    assert set(topics) == {"step", "aggregation"}, topics
    assert "nearest" in topics["step"] and "no batch dimension" in topics["aggregation"]


def test_titles_never_show_internal_values(service):
    view = service.resolve({"node_id": "subnet_pre"})
    title = tensors.series_title(view.selection, "mean")
    assert "none" not in title and "-1" not in title, title


def test_step_buttons_and_slider_walk_the_steps_of_the_shown_type(service, shown):
    steps = service.step_index(shown["trial"]).steps_of(ANY_TYPE).tolist()

    def step_after(trigger, value):
        return next_wanted(service, {}, shown, trigger, {**current_inputs(shown), trigger: value})[0]["training_step"]

    assert step_after("step_next", 1) == steps[1]
    assert step_after("step_prev", 1) == steps[0]  # stays at the start
    assert step_after("step_index", 4) == steps[4]
    assert step_after("step_index", 10**6) == steps[-1]


def test_roles_are_remembered_per_node(service, shown):
    inputs = {**current_inputs(shown), "role": "r2"}
    wanted, _ = next_wanted(service, {"roles": {"w": "bias"}}, shown, "role", inputs)
    assert wanted["roles"] == {"w": "bias", "input": "r2"}


def test_remember_follows_the_shown_step_but_keeps_a_node_that_is_missing_here(service):
    view = service.resolve({"node_id": "loss", "type_of_execution": "05_iterations", "iteration": 0})
    assert view.selection.node_id != "loss"
    kept = remember({"node_id": "loss", "iteration": 0}, view)
    assert kept["node_id"] == "loss" and kept["training_step"] == view.selection.training_step
    view = service.resolve({"node_id": "output"})
    assert remember({"node_id": "input"}, view)["node_id"] == "output"


@pytest.mark.parametrize("count", [1, 2, 7, 240, 12_000, 250_000])
def test_slider_marks_never_crowd(count):
    values = [i * 10 for i in range(count)]
    marks = slider_marks(values)
    assert 1 <= len(marks) <= 11
    assert 0 in marks and count - 1 in marks
    characters = sum(len(label) + 2 for label in marks.values())
    assert characters <= 66, marks  # fits a slider of ~500 px at ~8 px per character
    assert all(marks[i] == str(values[i]) for i in marks)


def test_view_outputs_fill_every_output(service):
    view = service.resolve({"node_id": "helper_partial_sums"})
    outputs = view_outputs(view, {"node_id": "helper_partial_sums"}, None)
    assert set(outputs) == set(view_state.VIEW_OUTPUTS)
    assert outputs["role_options"] == [{"label": r, "value": r} for r in ("partial_sums", "running_max")]
    assert outputs["store"]["shown"]["node_id"] == "helper_partial_sums"
    assert outputs["iteration"] == 0 and outputs["step_input"] == view.selection.training_step
    again = view_outputs(view, {}, outputs["store"]["shown"])
    assert again["shown"] is view_state.no_update  # an unchanged selection does not re-trigger the plots


def test_view_outputs_without_a_selection(tmp_path):
    (tmp_path / "trials").mkdir()
    service = RecordingService(tmp_path)
    outputs = view_outputs(service.resolve({}), {}, None)
    assert outputs["store"]["shown"] is None and outputs["step_max"] == 0 and outputs["banner"]


def test_a_selector_applies_when_nothing_is_shown_yet(service):
    wanted, _ = next_wanted(service, {}, None, "trial", {"trial": "other"})
    assert wanted == {"trial": "other"}


@pytest.mark.parametrize("with_visualization", [False, True])
def test_the_page_has_every_component_the_callbacks_use(with_visualization):
    from comgra.server import layout
    from comgra.server.layout import ID

    page = layout.full_page(with_visualization=with_visualization)  # every tab's panel built
    ids = {c.id for c in page._traverse() if isinstance(getattr(c, "id", None), str)}  # not pattern-matching ids
    expected = {value for name, value in vars(ID).items() if name.isupper()}
    if not with_visualization:
        expected.discard(ID.VISUALIZATION)
    assert expected <= ids
    assert {ID.nav(d) for d in ("left", "right", "up", "down")} <= ids
    used = {component for component, _ in [*view_state.VIEW_INPUTS.values(), *view_state.VIEW_OUTPUTS.values()]}
    first = layout.page(title="t", data_version="v", poll_ms=1000, with_visualization=with_visualization)
    first_ids = {c.id for c in first._traverse() if isinstance(getattr(c, "id", None), str)}
    assert used <= first_ids  # the Tensors tab is in the first page
    lazy = layout.lazy_tabs(with_visualization)
    assert {ID.panel(t) for t in lazy} <= first_ids
    assert len(first_ids) < len(ids)  # the other tabs' components come when their tab is first opened
    built: list[str] = []
    for tab in lazy:
        new = layout.panel_contents(tab, built, with_visualization)
        built += list(new)
    assert sorted(built) == sorted(lazy)
    assert layout.panel_contents("runs", [], with_visualization).keys() == {"runs", "graphs", "compare"}


@pytest.mark.parametrize("node, role, aggregation", [
    ("subnet_mem__out", "subnet_mem__out", "mean"), ("subnet_pre", "weight0", "none")])
def test_hover_cards_show_the_stores_min_mean_max(service, recording, node, role, aggregation):
    from comgra.store import GroupReader

    selection = service.resolve({"node_id": node}).selection
    summaries = service.node_summaries(selection.trial, selection.training_step, selection.iteration)
    (row,) = GroupReader(recording).trial(selection.trial).selection(
        training_step=selection.training_step, node=node, role=role, kind="forward",
        iteration=selection.data_iteration, aggregation=aggregation).to_pylist()
    assert summaries[node] == {name: row[name] for name in ("min", "mean", "max")}


def test_badges_come_from_the_service_when_it_has_them(service):
    class WithBadges:
        def finding_badges(self, trial):
            return {"output": "2 ⚠"} if trial == "t" else {}

    class Broken:
        def finding_badges(self, trial):
            raise RuntimeError("no findings")

    assert tensors.graph_badges(WithBadges(), "t") == {"output": "2 ⚠"}
    assert tensors.graph_badges(Broken(), "t") == {}

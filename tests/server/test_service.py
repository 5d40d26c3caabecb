"""The service answers the GUI's questions from the store, falling back and saying so."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from comgra.service import ANY_TYPE, RecordingService, parse_aggregation, series
from comgra.store import GroupReader
from comgra.store import format as fmt
from comgra.store import layout
from comgra.store.writer import _lock_trial as writer_lock

BUGGED = "trial_bugged_original_version"
FIXED = "trial_no_activation_function_on_output_layer"


@pytest.fixture(scope="module")
def service(recording: Path) -> RecordingService:
    return RecordingService(recording)


def stored_row(recording: Path, selection) -> dict:
    aggregation, sample = parse_aggregation(selection.aggregation)
    rows = GroupReader(recording).trial(selection.trial).selection(
        training_step=selection.training_step, kind=selection.kind, iteration=selection.data_iteration,
        node=selection.node, role=selection.role, aggregation=aggregation, sample=sample).to_pylist()
    assert len(rows) == 1
    return rows[0]


def test_the_default_view_shows_the_first_input_of_the_first_trial(service, recording):
    view = service.resolve({})
    selection = view.selection
    assert (selection.trial, selection.node_id, selection.kind, selection.aggregation) == (BUGGED, "input", "forward", "mean")
    assert selection.training_step == view.choices.steps[0] and selection.iteration == 0
    assert view.notices == [] and view.banners == []
    assert view.row == stored_row(recording, selection)
    assert view.choices.types[0] == ANY_TYPE and view.choices.trials == [BUGGED, FIXED]


@pytest.mark.parametrize("wanted, expected", [
    ({"node_id": "subnet_mem__out", "kind": "gradients", "aggregation": "sample:3"},
     {"node": "subnet_mem__out", "kind": "gradients", "aggregation": "sample:3"}),
    ({"node_id": "subnet_pre", "roles": {"subnet_pre": "weight1"}, "kind": "gradients"},
     {"node": "subnet_pre", "role": "weight1", "data_iteration": -1, "aggregation": "none"}),
    ({"node_id": "helper_partial_sums", "roles": {"helper_partial_sums": "running_max"}, "aggregation": "std"},
     {"role": "running_max", "aggregation": "std"}),
])
def test_a_valid_wish_is_shown_as_asked_and_matches_the_store(service, recording, wanted, expected):
    view = service.resolve(wanted)
    shown = view.selection.to_dict()
    assert {k: shown[k] for k in expected} == expected
    assert view.row == stored_row(recording, view.selection)


@pytest.mark.parametrize("wanted, shown, says", [
    ({"node_id": "input", "kind": "gradients"}, {"kind": "forward"}, "No 'gradients' values"),
    ({"node_id": "subnet_pre", "roles": {"subnet_pre": "bias1"}, "kind": "gradients"},
     {"kind": "forward", "role": "bias1"}, "frozen parameter"),
    ({"node_id": "subnet_out", "aggregation": "sample:1"}, {"aggregation": "none"}, "has no batch dimension"),
    ({"node_id": "loss", "iteration": 0, "type_of_execution": "03_iterations"}, {"node_id": "input"},
     "Node 'loss' does not exist in iteration 0"),
    ({"iteration": 99}, {}, "showing iteration"),
    ({"training_step": 3}, {}, "Training step 3 is not recorded"),
    ({"trial": "no_such_trial"}, {"trial": BUGGED}, "Trial 'no_such_trial' is not in this recording"),
    ({"type_of_execution": "42_iterations"}, {"type_of_execution": ANY_TYPE}, "'42_iterations'"),
    ({"node_id": "input", "roles": {"input": "nope"}}, {"role": "input"}, "'nope'"),
])
def test_an_invalid_wish_falls_back_and_says_so(service, recording, wanted, shown, says):
    view = service.resolve(wanted)
    assert view.selection is not None
    assert {k: view.selection.to_dict()[k] for k in shown} == shown
    assert any(says in notice for notice in view.notices), view.notices
    assert view.row == stored_row(recording, view.selection)


def test_defaults_that_do_not_apply_fall_back_silently(service):
    view = service.resolve({"node_id": "subnet_out"})  # a parameter: no batch, yet no notice
    assert view.selection.aggregation == "none" and view.notices == []


def test_a_step_of_another_type_snaps_to_the_nearest_step_of_the_wanted_type(service):
    index = service.step_index(BUGGED)
    type_ = index.types_of_execution()[0]
    steps = index.steps_of(type_).tolist()
    view = service.resolve({"type_of_execution": type_, "training_step": steps[0] + 1})
    assert view.selection.training_step == steps[0] and view.choices.steps == steps
    assert view.selection.step_type == type_


def test_an_iteration_past_the_end_shows_the_last_iteration(service):
    view = service.resolve({"type_of_execution": "05_iterations", "iteration": 19})
    assert view.selection.iteration == 4 and view.choices.iterations == [0, 1, 2, 3, 4]


def test_a_node_from_the_previous_iteration_reads_that_iteration(service, recording):
    view = service.resolve({"type_of_execution": "05_iterations", "iteration": 3, "node_id": "subnet_mem__out*old"})
    assert (view.selection.node, view.selection.data_iteration) == ("subnet_mem__out", 2)
    assert view.row == stored_row(recording, view.selection)


def test_categories_of_dynamic_recordings_label_the_samples(service):
    view = service.resolve({"trial": FIXED})
    assert ("sample:1", "Sample 1 (negative)") in view.choices.aggregations


def test_a_click_in_a_kept_step_shows_what_a_fresh_read_shows(recording, monkeypatch):
    """The hover cards keep the shown step; the node clicks that follow read no file and show the same rows."""
    fresh, kept = RecordingService(recording), RecordingService(recording)
    first = kept.resolve({"type_of_execution": "05_iterations", "iteration": 3})
    step, trial = first.selection.training_step, first.selection.trial
    kept.node_summaries(trial, step, 3, rank=0)

    def no_query(*_args, **_kwargs):
        raise AssertionError("a click in a kept step queried the store")
    monkeypatch.setattr(kept.step_reads, "tensor_rows", no_query)
    checked = 0
    for iteration in (0, 3, 4):
        wanted = {"type_of_execution": "05_iterations", "training_step": step, "iteration": iteration}
        for node in kept.resolve(wanted).graph["nodes"]:
            for aggregation in ("mean", "sample:2", "none"):
                asked = {**wanted, "node_id": node["id"], "aggregation": aggregation, "kind": "gradients"}
                expected, got = fresh.resolve(asked), kept.resolve(asked)
                assert got.selection == expected.selection and got.notices == expected.notices
                assert got.choices == expected.choices
                assert repr(got.row) == repr(expected.row)  # NaN included
                if got.row is not None:
                    assert repr(got.row) == repr(stored_row(recording, got.selection))
                checked += 1
    assert checked >= 3 * 3 * 10


def test_series_has_one_curve_per_trial_limited_to_the_type(service, recording):
    view = service.resolve({"type_of_execution": "01_iterations", "node_id": "output"})
    curves = series(service, view.selection, "abs_max")
    assert [c.trial for c in curves] == [BUGGED, FIXED]
    index = service.step_index(BUGGED)
    assert curves[0].steps.tolist() == index.steps_of("01_iterations").tolist()
    reader = GroupReader(recording).trial(BUGGED)
    expected = reader.selection(training_step=int(curves[0].steps[0]), node="output", iteration=0, kind="forward",
                                aggregation="mean", role="output").column("abs_max")[0].as_py()
    assert curves[0].values[0] == pytest.approx(expected)


def test_modules_have_parameter_totals(service):
    (root,) = service.modules(BUGGED)
    assert root["total"] == sum(s["total"] for s in root["submodules"])
    subnet_pre = root["submodules"][0]
    assert subnet_pre["total"] == sum(p["numel"] for p in subnet_pre["parameters"]) > 0


def test_notes_and_kpis_come_from_the_store(service, recording):
    assert service.notes(BUGGED) == GroupReader(recording).trial(BUGGED).notes() != []
    assert service.kpis(BUGGED).num_rows > 0


def test_data_version_changes_when_a_run_writes_a_chunk(fresh_recording):
    service = RecordingService(fresh_recording)
    before = service.data_version()
    trial = service.trials()[0]
    index = service.step_index(trial)
    rows = index.table.slice(0, 1).to_pylist()
    rows[0]["training_step"] = 10**6
    # As a run does: it writes trial.json, and its writer holds the trial's lock while it writes (service.changes
    # lists the chunks of such trials only).
    directory = fmt.trial_dir(fresh_recording, trial)
    fmt.write_json_atomic(directory / fmt.TRIAL_META, json.loads((directory / fmt.TRIAL_META).read_text()))
    lock = writer_lock(directory, 0)
    try:
        assert service.data_version() != before  # a writer took the trial
        before = service.data_version()
        fmt.write_parquet_atomic(layout.rank_dir(directory, "steps", 0) / fmt.chunk_name(999, 10**6, 10**6),
                                 pa.Table.from_pylist(rows, schema=fmt.STEPS_SCHEMA))
        assert service.data_version() != before
    finally:
        os.close(lock)
    assert service.step_index(trial).steps_of(ANY_TYPE)[-1] == 10**6


def test_an_empty_group_gets_a_banner(tmp_path):
    (tmp_path / "trials").mkdir()
    view = RecordingService(tmp_path).resolve({})
    assert view.selection is None and "no trials yet" in view.banners[0]


def test_an_empty_trial_gets_a_banner_and_other_trials_still_work(fresh_recording):
    fmt.write_json_atomic(fmt.trial_dir(fresh_recording, "a_empty") / fmt.TRIAL_META,
                          {"format_version": 1, "trial_id": "a_empty", "modules": []})
    service = RecordingService(fresh_recording)
    view = service.resolve({})
    assert view.selection is None and "no recorded steps yet" in view.banners[0]
    other = service.resolve({"trial": service.trials()[1]})
    assert other.selection is not None and other.banners == []
    assert service.modules("a_empty") == []


def test_a_newer_format_gets_a_banner(fresh_recording):
    path = fmt.trial_dir(fresh_recording, "b_future") / fmt.TRIAL_META
    fmt.write_json_atomic(path, {"format_version": fmt.FORMAT_VERSION + 1, "trial_id": "b_future"})
    view = RecordingService(fresh_recording).resolve({"trial": "b_future"})
    assert view.selection is None and "format_version" in view.banners[0] and "Upgrade" in view.banners[0]


def test_a_corrupt_chunk_is_skipped_and_reported(fresh_recording):
    service = RecordingService(fresh_recording)
    trial = service.trials()[0]
    first = service.resolve({}).selection.training_step
    chunks = sorted((layout.rank_dir(fmt.trial_dir(fresh_recording, trial), "tensors", 0)).glob("*.parquet"))
    chunks[-1].write_bytes(b"not parquet at all")
    view = service.resolve({"training_step": first})
    assert view.row is not None
    last_step = service.step_index(trial).steps_of(ANY_TYPE)[-1]
    damaged = service.resolve({"training_step": int(last_step)})
    assert any(f"Skipped tensors/{chunks[-1].name}" in b and "damaged" in b for b in damaged.banners), damaged.banners
    assert damaged.selection is not None


def test_graph_json_is_read_through_the_reader(service, recording):
    view = service.resolve({})
    name = view.graph["hash"]
    on_disk = json.loads((fmt.trial_dir(recording, BUGGED) / "graphs" / f"{name}.json").read_text())
    assert view.graph == on_disk


def test_a_series_is_read_once_until_a_run_writes_more(fresh_recording, monkeypatch):
    from comgra.store.reader import TrialReader

    service = RecordingService(fresh_recording)
    calls = []
    original = TrialReader.series
    monkeypatch.setattr(TrialReader, "series", lambda self, **kw: calls.append(kw) or original(self, **kw))
    selection = service.resolve({"node_id": "output"}).selection
    first = series(service, selection, "mean")
    later = service.resolve({"node_id": "output", "training_step": service.step_index(BUGGED).steps_of(ANY_TYPE)[-1]})
    assert [c.values.tolist() for c in series(service, later.selection, "mean")] == [c.values.tolist() for c in first]
    assert len(calls) == 1
    series(service, selection, "max")
    assert len(calls) == 2
    trial = service.step_index(BUGGED)
    rows = trial.table.slice(0, 1).to_pylist()
    rows[0]["training_step"] = 10**6
    fmt.write_parquet_atomic(layout.rank_dir(fmt.trial_dir(fresh_recording, BUGGED), "steps", 0) / fmt.chunk_name(999, 10**6, 10**6),
                             pa.Table.from_pylist(rows, schema=fmt.STEPS_SCHEMA))
    series(service, selection, "mean")
    assert len(calls) == 3


def test_a_closed_service_opens_the_store_again_when_asked(fresh_recording):
    service = RecordingService(fresh_recording)
    before = service.resolve({}).row
    service.close()
    assert service.resolve({}).row == before


# -- steps read together, ahead of the step buttons -------------------------------------------------------
def _sorted_rows(table: pa.Table) -> list[str]:
    return sorted(repr(row) for row in table.to_pylist())  # repr: NaN equals NaN


def test_steps_read_together_are_the_rows_of_each_step_read_alone(recording):
    """Three steps in one read (across chunks: 5 steps per chunk) give each step's rows exactly."""
    trial = GroupReader(recording).trial(BUGGED)
    steps = sorted(set(trial.steps().column("training_step").to_pylist()))
    wanted = [steps[3], steps[4], steps[5], steps[11]]
    together = trial.steps_selection(wanted, rank=0)
    for step in wanted:
        alone = trial.selection(training_step=step, rank=0)
        assert alone.num_rows > 0
        mine = together.filter(pa.compute.equal(together["training_step"], step))
        assert _sorted_rows(mine) == _sorted_rows(alone)
    assert together.num_rows == sum(trial.selection(training_step=s).num_rows for s in wanted)


def _wait_until_kept(service, trial, step, rank=0, seconds=60.0):
    import time

    index = service.step_index(trial, rank)
    deadline = time.monotonic() + seconds
    while service.step_reads._kept_step(trial, index, step, rank) is None:
        assert time.monotonic() < deadline, f"step {step} was not read ahead"
        time.sleep(0.02)


def test_after_a_step_is_shown_the_next_steps_values_read_no_file(recording, monkeypatch):
    """The values route reads the steps ahead in the background; the next-step button's answer then comes
    from kept rows (no query at all) and equals a fresh service's answer and the store's row."""
    from comgra.server.tensors import click_values

    fresh, ahead = RecordingService(recording), RecordingService(recording)
    try:
        view = ahead.resolve({"type_of_execution": "05_iterations", "iteration": 2, "node_id": "subnet_mem__out",
                              "aggregation": "sample:1"})
        selection = view.selection
        store = {"wanted": {"type_of_execution": "05_iterations", "iteration": 2, "node_id": "subnet_mem__out",
                            "aggregation": "sample:1"}, "shown": selection.to_dict()}
        ahead.prefetch_near(selection)
        typed = ahead.step_index(selection.trial).steps_of("05_iterations").tolist()
        following = typed[typed.index(selection.training_step) + 1]
        _wait_until_kept(ahead, selection.trial, following)

        def no_query(*_args, **_kwargs):
            raise AssertionError("the next step's values queried the store")
        monkeypatch.setattr(ahead.step_reads, "tensor_rows", no_query)
        monkeypatch.setattr(ahead.trial(selection.trial), "steps_selection", no_query)
        got = click_values(ahead, {"selection": store, "trigger": "step_next"})
        expected = click_values(fresh, {"selection": store, "trigger": "step_next"})
        assert json.dumps(got) == json.dumps(expected)
        next_view = fresh.resolve({**store["wanted"], "training_step": following})
        assert next_view.selection.training_step == following
        stored = stored_row(recording, next_view.selection)
        shown = {s["name"]: s["value"] for s in got["values"]["stats"]}
        assert float(shown["mean"]) == stored["mean"] and float(shown["max"]) == stored["max"]
    finally:
        fresh.close()
        ahead.close()


def test_a_step_asked_by_several_at_once_is_read_once(recording, monkeypatch):
    """The values route, the view callback and the hover cards ask for a new step at the same moment: one
    read serves them all, and each gets the store's rows."""
    import threading
    import time

    service = RecordingService(recording)
    try:
        trial = service.trial(BUGGED)
        reads: list[list[int]] = []
        original = trial.steps_selection

        def slow_read(steps, **kwargs):
            reads.append(list(steps))
            time.sleep(0.3)  # the others ask while this read is under way
            return original(steps, **kwargs)
        monkeypatch.setattr(trial, "steps_selection", slow_read)
        step = int(service.step_index(BUGGED).steps_of(ANY_TYPE)[6])
        answers: list[pa.Table] = []
        threads = [threading.Thread(target=lambda: answers.append(service.step_rows(BUGGED, step, 0)))
                   for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert len(reads) == 1 and step in reads[0]
        expected = _sorted_rows(GroupReader(recording).trial(BUGGED).selection(training_step=step, rank=0))
        assert len(answers) == 3 and all(_sorted_rows(a) == expected for a in answers)
    finally:
        service.close()


def test_hover_cards_of_a_step_read_ahead_show_the_stores_numbers(recording):
    service = RecordingService(recording)
    try:
        steps = service.step_index(BUGGED).steps_of(ANY_TYPE).tolist()
        service.step_rows(BUGGED, steps[2], 0)  # reads steps[0] .. steps[8] together
        reader = GroupReader(recording).trial(BUGGED)
        for step in steps[3:9]:
            graph = service.graph_at(BUGGED, step, 0, 0)
            cards = service.node_summaries(BUGGED, step, 0)
            assert len(cards) == len(graph["nodes"])
            for node in graph["nodes"]:
                (row,) = reader.selection(training_step=step, node=node["node"], role=node["roles"][0],
                                          kind="forward", iteration=0 if node["absolute_iteration"] is None else -1,
                                          aggregation="mean" if node["has_batch"] else "none").to_pylist()
                assert cards[node["id"]] == {name: row[name] for name in ("min", "mean", "max")}
    finally:
        service.close()


def _prefetch_and_wait(service, selection) -> None:
    """Ask for the read-ahead of ``selection`` and wait until the prefetcher has nothing left to do."""
    import time

    service.prefetch_near(selection)
    deadline = time.monotonic() + 60
    prefetch = service.step_reads._prefetch
    while True:
        with prefetch._wake:
            idle = prefetch._latest is None and not service.step_reads._reading
        if idle:
            return
        assert time.monotonic() < deadline, "the read-ahead did not end"
        time.sleep(0.02)


def test_the_read_ahead_keeps_the_steps_of_the_shown_type_around_it_among_many_types(tmp_path, synthetic):
    """Five types of step, 48 steps: after the read-ahead of a step, that step, the previous
    STEPS_READ_BEHIND and the next STEPS_KEPT_AHEAD steps of its type are all kept (none pushed out by
    the read itself), and no step of another type was read."""
    from comgra.service import STEPS_KEPT_AHEAD, STEPS_READ_BEHIND, prefetch_window

    group = synthetic.write_recording(tmp_path, synthetic.Options(scale=0.2, trials=1, steps_per_chunk=4))
    service = RecordingService(group)
    try:
        trial = service.trials()[0]
        index = service.step_index(trial)
        for type_ in ("01_iterations", "05_iterations"):
            typed = index.steps_of(type_).tolist()
            assert len(typed) > STEPS_READ_BEHIND + STEPS_KEPT_AHEAD + 2, type_
            step = typed[STEPS_READ_BEHIND + 1]
            selection = service.resolve({"trial": trial, "type_of_execution": type_, "training_step": step}).selection
            assert selection.training_step == step
            _prefetch_and_wait(service, selection)
            position = typed.index(step)
            expected = typed[position - STEPS_READ_BEHIND:position + 1 + STEPS_KEPT_AHEAD]
            assert prefetch_window(index, type_, step)[0][1:] == expected
            kept = {key[1] for key in service.step_reads._steps if key[0] == trial}
            assert set(expected) <= kept, (type_, sorted(set(expected) - kept))
            assert kept <= set(typed), "steps of other types were read ahead"
            service.step_reads._steps.clear()
    finally:
        service.close()


def test_walking_with_the_next_step_button_reads_ahead_once_every_few_steps(tmp_path, synthetic, monkeypatch):
    """Clicking through 20 steps one by one: each next step is kept when it is asked for, and the
    background reads are few (one per STEPS_READ_AHEAD - STEPS_KEPT_AHEAD steps or so), each of
    several steps."""
    from comgra.service import STEPS_KEPT_AHEAD, STEPS_READ_AHEAD

    group = synthetic.write_recording(tmp_path, synthetic.Options(scale=0.15, nodes=40, trials=1, steps_per_chunk=4,
                                                                  distinct_steps=3))
    service = RecordingService(group)
    try:
        trial = service.trials()[0]
        reader = service.trial(trial)
        reads: list[list[int]] = []
        original = reader.steps_selection
        monkeypatch.setattr(reader, "steps_selection", lambda steps, **kw: reads.append(list(steps)) or original(steps, **kw))
        steps = service.step_index(trial).steps_of(ANY_TYPE).tolist()[:21]
        index = service.step_index(trial)
        for step, following in zip(steps, steps[1:]):
            selection = service.resolve({"trial": trial, "training_step": step}).selection
            _prefetch_and_wait(service, selection)
            assert service.step_reads._kept_step(trial, index, following, 0) is not None, f"step {following} was not read ahead"
        assert 1 < len(reads) <= 2 + len(steps) // (STEPS_READ_AHEAD - STEPS_KEPT_AHEAD), reads
        assert all(len(read) > 1 for read in reads[1:]), reads
    finally:
        service.close()


def test_the_series_of_a_new_tensor_is_read_at_a_lower_priority(recording, monkeypatch):
    """The read of every chunk runs on the low-priority thread (niceness raised on Linux), not on the
    request's thread, and answers the store's series."""
    import os
    import sys
    import threading

    from comgra.service import LOW_PRIORITY_NICE

    service = RecordingService(recording)
    try:
        selection = service.resolve({"node_id": "subnet_mem__out"}).selection
        trial = service.trial(selection.trial)
        seen: list[tuple[str, int]] = []
        original = trial.series

        def watched(**kwargs):
            seen.append((threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
            return original(**kwargs)
        monkeypatch.setattr(trial, "series", watched)
        mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        steps, values = service.statistic_series(selection.trial, selection, "max")
        (name, niceness), = seen
        assert name.startswith("comgra-whole-trial-read") and name != threading.current_thread().name
        if sys.platform.startswith("linux"):
            assert niceness == min(19, mine + LOW_PRIORITY_NICE)
        expected = GroupReader(recording).trial(selection.trial).series(
            node=selection.node, role=selection.role, kind=selection.kind, iteration=selection.data_iteration,
            aggregation="mean", statistic="max")
        assert steps.tolist() == expected.column("training_step").to_pylist()
        assert values.tolist() == pytest.approx(expected.column("value").to_pylist())
    finally:
        service.close()


def test_the_neuron_values_of_a_kept_step_read_no_file(recording, monkeypatch):
    """The histogram's values come from the step's kept rows (a one-row query in a 50x chunk costs
    hundreds of milliseconds beside the next click) and equal the store's row."""
    service = RecordingService(recording)
    try:
        selection = service.resolve({"node_id": "subnet_mem__out", "aggregation": "sample:2"}).selection
        service.step_rows(selection.trial, selection.training_step, selection.rank)  # as the hover cards do

        def no_query(*_args, **_kwargs):
            raise AssertionError("the neuron values queried the store")
        monkeypatch.setattr(service.step_reads, "tensor_rows", no_query)
        stored = service.neuron_values(selection)
        row = stored_row(recording, selection)
        assert stored.values == pytest.approx(row["neurons"]) and len(stored.values) > 1
        assert stored.shape == row["shape"] and stored.total == row["num_neurons"]
    finally:
        service.close()


def test_a_whole_trial_read_that_has_not_started_gives_way_to_a_newer_one():
    """Three series reads asked while the first runs: the running one ends with its answer, the one
    queued behind it is dropped (ReadSuperseded) when a third is asked, and the third runs."""
    import threading

    from comgra.service.read_threads import LowPriorityReads, ReadSuperseded

    reads = LowPriorityReads()
    release = threading.Event()
    answers: dict[str, object] = {}

    def ask(name, read):
        try:
            answers[name] = reads.run(read)
        except ReadSuperseded as error:
            answers[name] = error

    def slow(_cancelled):  # looks at nothing: ends with its answer however many reads are asked
        release.wait(10)
        return "first"
    try:
        first = threading.Thread(target=ask, args=("first", slow))
        first.start()
        while not reads._worker_ids:  # the first read has started
            threading.Event().wait(0.01)
        second = threading.Thread(target=ask, args=("second", lambda _cancelled: "second"))
        second.start()
        while not reads._waiting or reads._waiting[0].running():
            threading.Event().wait(0.01)
        threading.Event().wait(0.05)
        third = threading.Thread(target=ask, args=("third", lambda _cancelled: "third"))
        third.start()
        second.join(10)
        assert isinstance(answers.get("second"), ReadSuperseded)
        release.set()
        first.join(10)
        third.join(10)
        assert answers["first"] == "first" and answers["third"] == "third"
    finally:
        release.set()
        reads.close()


def test_a_running_whole_trial_read_stops_when_a_newer_one_is_asked():
    """A read under way that looks at ``cancelled()`` between its chunks ends with ReadSuperseded as soon
    as a newer read is asked for, and the newer one runs (a series of seconds nobody would see)."""
    import threading

    from comgra.service.read_threads import LowPriorityReads, ReadSuperseded
    from comgra.store.series_read import ReadCancelled

    reads = LowPriorityReads()
    started, answers = threading.Event(), {}
    chunks_read = []

    def chunked(cancelled):
        started.set()
        for chunk in range(1000):
            if cancelled():
                raise ReadCancelled("no longer wanted")
            chunks_read.append(chunk)
            threading.Event().wait(0.01)
        return "all chunks"

    def ask(name, read):
        try:
            answers[name] = reads.run(read)
        except ReadSuperseded as error:
            answers[name] = error
    try:
        first = threading.Thread(target=ask, args=("first", chunked))
        first.start()
        assert started.wait(10)
        ask("second", lambda cancelled: "second")
        first.join(10)
        assert isinstance(answers["first"], ReadSuperseded) and answers["second"] == "second"
        assert len(chunks_read) < 1000
    finally:
        reads.close()


def test_the_same_series_asked_twice_at_once_is_read_once(recording, monkeypatch):
    """A node click's series is still being read when the next step's view asks for the same series: the
    second question waits for the first read (one read, not two of seconds each) and both get its answer,
    the store's series."""
    import threading

    service = RecordingService(recording)
    try:
        selection = service.resolve({"node_id": "subnet_mem__out"}).selection
        trial = service.trial(selection.trial)
        original, calls, release = trial.series, [], threading.Event()

        def slow(**kwargs):
            calls.append(kwargs["node"])
            release.wait(10)
            return original(**kwargs)
        monkeypatch.setattr(trial, "series", slow)
        answers = []
        askers = [threading.Thread(target=lambda: answers.append(service.statistic_series(
            selection.trial, selection, "max"))) for _ in range(2)]
        askers[0].start()
        while not calls:
            threading.Event().wait(0.01)
        askers[1].start()
        threading.Event().wait(0.2)
        release.set()
        for asker in askers:
            asker.join(10)
        assert calls == [selection.node]
        expected = GroupReader(recording).trial(selection.trial).series(
            node=selection.node, role=selection.role, kind=selection.kind, iteration=selection.data_iteration,
            aggregation="mean", statistic="max")
        assert len(answers) == 2
        for steps, values in answers:
            assert steps.tolist() == expected.column("training_step").to_pylist()
            assert values.tolist() == pytest.approx(expected.column("value").to_pylist())
    finally:
        release.set()
        service.close()


def test_a_series_asked_again_while_its_superseded_read_ends_is_read_anew(recording, monkeypatch):
    """Node A, then B, then A again, while A's first read is still under way: the first two questions are
    superseded (the user has moved on), and the third, the latest wish, gets A's series from a new read
    (joining the dying read would have left the plot without an answer)."""
    import threading

    from comgra.service import ReadSuperseded
    from comgra.store.series_read import ReadCancelled

    service = RecordingService(recording)
    try:
        first = service.resolve({"node_id": "subnet_mem__out"}).selection
        other = service.resolve({"node_id": "helper_partial_sums"}).selection
        trial = service.trial(first.trial)
        original, calls, let_first_see = trial.series, [], threading.Event()

        def watched(**kwargs):
            calls.append(kwargs["node"])
            if len(calls) == 1:
                let_first_see.wait(10)
                if kwargs["cancelled"]():
                    raise ReadCancelled("superseded")
            return original(**kwargs)
        monkeypatch.setattr(trial, "series", watched)
        answers: dict[str, object] = {}

        def ask(name, selection):
            try:
                answers[name] = service.statistic_series(selection.trial, selection, "max")
            except ReadSuperseded as error:
                answers[name] = error
        threads = {name: threading.Thread(target=ask, args=(name, selection))
                   for name, selection in (("A", first), ("B", other), ("A again", first))}
        threads["A"].start()
        while not calls:
            threading.Event().wait(0.01)
        threads["B"].start()
        while service.step_reads._whole_trial_reads.asked < 2:
            threading.Event().wait(0.01)
        threads["A again"].start()
        threading.Event().wait(0.2)  # "A again" has joined A's read
        let_first_see.set()
        for thread in threads.values():
            thread.join(10)
        assert isinstance(answers["A"], ReadSuperseded) and isinstance(answers["B"], ReadSuperseded)
        steps, values = answers["A again"]
        expected = GroupReader(recording).trial(first.trial).series(
            node=first.node, role=first.role, kind=first.kind, iteration=first.data_iteration,
            aggregation="mean", statistic="max")
        assert steps.tolist() == expected.column("training_step").to_pylist()
        assert values.tolist() == pytest.approx(expected.column("value").to_pylist())
        assert calls[0] == calls[-1] == first.node and calls.count(first.node) == 2  # B, if it started, stopped
    finally:
        let_first_see.set()
        service.close()

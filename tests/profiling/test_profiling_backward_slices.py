"""The attribution of backward time to module calls (profiling/backward_slices), on hand-made timelines and
on random ones, and on the tutorial's recurrent network, whose modules run up to 10 times per step."""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from comgra.profiling.backward_slices import attribute, parents_of


def test_the_calls_of_an_rnn_cell_each_get_their_own_slice() -> None:
    # net (0) runs cell (1, 2, 3) three times and a readout (4); the backward pass finishes at 10. The
    # readout's output is the net's: they share the first moment, and the innermost, the readout, has it.
    starts = [0.0, 6.0, 3.0, 1.0, 0.0]
    total, first = attribute(starts, [None] * 5, [5, 2, 3, 4, 5], finishes=[10.0])
    assert total == [10.0, 4.0, 3.0, 2.0, 1.0]
    assert first == starts


def test_a_parent_keeps_the_time_between_children_that_have_an_end() -> None:
    # parent (0) = b(own work(a(x))) where a and b have no parameters, so their inputs' gradients end
    # them: b starts with the parent and ends at 2; the parent's own work until a starts at 5; a ends at 6.
    total, _ = attribute([0.0, 5.0, 0.0], [None, 6.0, 2.0], [3, 2, 3], finishes=[7.0])
    assert total == [7.0, 1.0, 2.0]  # the parent's self time: 2 to 5, and 6 until the pass finishes at 7


def test_each_backward_pass_finishes_every_call_in_it() -> None:
    # two roots reached by two backward passes: a from 1 (pass one finishes at 2), b from 4 (finishes at 6).
    total, _ = attribute([1.0, 4.0], [None, None], [1, 2], finishes=[2.0, 6.0])
    assert total == [1.0, 2.0]


def test_time_outside_every_module_is_nobodys() -> None:
    # two roots: a from 1 to 2, b from 4 to 5; from 2 to 4 the loss or user code runs.
    total, _ = attribute([1.0, 4.0], [2.0, 5.0], [1, 2])
    assert total == [1.0, 1.0]


def test_a_call_never_reached_by_a_gradient() -> None:
    # the parent's output needs no gradient (no start), its child's does: the parent shows the child's time.
    total, first = attribute([None, 2.0, None], [None, 3.0, None], [2, 2, 3])
    assert total == [1.0, 1.0, None]
    assert first == [2.0, 2.0, None]


def test_parents_come_from_the_order_the_calls_began() -> None:
    assert parents_of([4, 3, 3, 4, 5]) == [-1, 0, 1, 0, -1]
    assert parents_of([None, None]) == [-1, -1]  # a forward that raised: taken as no nested calls


@st.composite
def _timelines(draw: Any) -> tuple[list[float | None], list[float | None], list[int], list[float]]:
    """A random call tree in pre-order and random start and end moments (some never reached)."""
    count = draw(st.integers(1, 12))
    parents = [-1] + [draw(st.integers(-1, index - 1)) for index in range(1, count)]
    for index in range(1, count):  # pre-order: a parent's subtree is contiguous, so only a recent call can be it
        while parents[index] >= 0 and not _can_enclose(parents, parents[index], index):
            parents[index] = parents[parents[index]]
    subtree_ends = list(range(1, count + 1))
    for index in range(count - 1, -1, -1):
        parent = parents[index]
        if parent >= 0:
            subtree_ends[parent] = max(subtree_ends[parent], subtree_ends[index])
    moment = st.one_of(st.none(), st.integers(0, 40).map(float))
    finishes = draw(st.lists(st.integers(0, 40).map(float), max_size=3))
    return [draw(moment) for _ in range(count)], [draw(moment) for _ in range(count)], subtree_ends, finishes


def _can_enclose(parents: list[int], candidate: int, index: int) -> bool:
    """``candidate`` can still be open when ``index`` begins: every call between them is inside it."""
    for between in range(candidate + 1, index):
        ancestor = between
        while ancestor >= 0 and ancestor != candidate:
            ancestor = parents[ancestor]
        if ancestor != candidate:
            return False
    return True


@settings(max_examples=300, deadline=None)
@given(_timelines())
def test_a_parent_contains_its_children_and_no_moment_is_counted_twice(timeline: Any) -> None:
    starts, ends, subtree_ends, finishes = timeline
    total, _ = attribute(starts, ends, subtree_ends, finishes)
    parents = parents_of(subtree_ends)
    for index, parent in enumerate(parents):
        if parent >= 0 and total[index] is not None:
            assert total[parent] is not None and total[parent] >= total[index] - 1e-9
    children_sum = [0.0] * len(starts)
    for index, parent in enumerate(parents):
        if parent >= 0 and total[index] is not None:
            children_sum[parent] += total[index]
    assert all(total[i] is None or total[i] >= children_sum[i] - 1e-9 for i in range(len(starts)))
    moments = [m for m in starts + ends + finishes if m is not None]
    roots = sum(total[i] or 0.0 for i, parent in enumerate(parents) if parent < 0)
    assert roots <= (max(moments) - min(moments) if moments else 0.0) + 1e-9


def test_the_tutorials_backward_times_fit_in_its_backward_pass(make_recorder: Any, monkeypatch: Any) -> None:
    """The tutorial's subnets run once per iteration (8 here) with shared parameters: the roots' backward times
    of a step can never add up to more than that step's ``loss.backward()``, timed here by the test."""
    torch = pytest.importorskip("torch")
    import time

    import comgra
    from comgra.examples import tutorial

    walls: list[float] = []
    backward = torch.Tensor.backward

    def timed_backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return backward(self, *args, **kwargs)
        finally:
            walls.append(time.perf_counter() - start)

    monkeypatch.setattr(torch.Tensor, "backward", timed_backward)
    torch.manual_seed(0)
    model = tutorial.SequenceSumNetwork(32, activate_output=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    recorder = make_recorder(steps={0}, resource_seconds=None)
    recorder.track_module("main_model", model, profile=True)
    generator = torch.Generator().manual_seed(1)
    comgra.my_recorder = recorder
    for step in range(3):
        tutorial._training_step(model, optimizer, step, tutorial._make_batch(8, generator, torch.device("cpu")))
    profiler = recorder.instruments.profiler
    rows = [row for name in profiler.layer_names for row in profiler.history(name)]
    roots = {"main_model.subnet_pre", "main_model.subnet_mem", "main_model.subnet_out"}
    assert len(walls) == 3
    for step, wall in enumerate(walls):
        mine = [r for r in rows if r["training_step"] == step and r["backward_time"] is not None]
        assert sum(r["module"] == "main_model.subnet_pre" for r in mine) == 8
        assert 0 < sum(r["backward_time"] for r in mine if r["module"] in roots) <= wall


@settings(max_examples=200, deadline=None)
@given(st.lists(_timelines(), min_size=1, max_size=4))
def test_the_rows_of_many_steps_at_once_give_each_step_what_attribute_gives_it(timelines: Any) -> None:
    """The profiler makes the rows of all the steps of a flush at once, in arrays (profiling/layer_rows); each
    step's backward times and first moments must be what ``attribute`` gives that step alone."""
    torch = pytest.importorskip("torch")
    from comgra.profiling.layer_calls import Layer
    from comgra.profiling.layer_rows import LayerRows, StepCapture

    layers = [Layer(f"m{index}", index, torch.nn.Identity(), 100, [0]) for index in range(12)]
    captures, expected = [], []
    for step, (starts, ends, subtree_ends, finishes) in enumerate(timelines):
        if step % 2 == 0:  # odd steps keep their ends: both the array path (no ends) and the sweep (ends) are tried
            ends = [None] * len(starts)
        records = [[layers[i], 0.0, 1.0, 0, start, end, None, subtree_end]
                   for i, (start, end, subtree_end) in enumerate(zip(starts, ends, subtree_ends))]
        captures.append(StepCapture(step, records, sorted(finishes), None, 0.0))
        total, first = attribute(starts, ends, subtree_ends, sorted(finishes))
        expected += [(t, None if t is None else f) for t, f in zip(total, first)]
    table, _ = LayerRows("perf_counter").convert(captures, lambda capture: (0.0, None))
    got = list(zip(table.column("backward_time").to_pylist(), table.column("backward_start").to_pylist()))
    assert [(None if t is None else pytest.approx(t), f) for t, f in expected] == got

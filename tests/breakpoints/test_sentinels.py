"""The sentinels' reductions against the test's own, for the tensors a run may watch (table-driven)."""
from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from comgra.breakpoints.sentinels import Sentinels

CASES = {
    "float": (torch.tensor([[1.5, -4.0], [2.0, 0.5]]), None),
    "integer": (torch.arange(5), None),
    "complex": (torch.tensor([3 + 4j, 1 - 1j]), None),
    "nan": (torch.tensor([1.0, math.nan, 2.0]), "nan"),
    "inf": (torch.tensor([1.0, -math.inf]), "inf"),
    "empty": (torch.zeros(0, 3), "empty"),
}


def _with_kernel(sentinels: Sentinels) -> Sentinels:
    """Wired to the C kernel as capture/evidence.py wires a recorder's: small CPU tensors reduced at finish_batch."""
    from comgra.capture import fused
    assert fused.ensure_built()
    sentinels.defer_up_to, sentinels.defer_floats_up_to = fused.EXTREMES_UP_TO, fused.EXTREMES_FLOAT_UP_TO
    sentinels.spec, sentinels.reduce_many = fused.extremes_spec, fused.many_extremes
    return sentinels


def _rows(tensors: dict[str, torch.Tensor], batch_size: int = 4,
          kernel: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
    tables, said = [], []
    sentinels = Sentinels(put=tables.append, warn=lambda key, message: said.append(message), note=lambda note: None)
    if kernel:
        _with_kernel(sentinels)
    sentinels.configure(list(tensors), enabled=True, pause_on_error=False)
    sentinels.start_batch(3, "training", batch_size, recorded=False)
    for name, tensor in tensors.items():
        sentinels.register(name, tensor, is_loss=False)
    sentinels.finish_batch(pausable=False)
    sentinels.close()
    return [row for table in tables for row in table.to_pylist()], said


@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "kernel"])
@pytest.mark.parametrize("case", CASES, ids=CASES)
def test_each_kind_of_tensor(case: str, kernel: bool) -> None:
    tensor, event = CASES[case]
    rows, said = _rows({case: tensor}, kernel=kernel)
    (row,) = [r for r in rows if r["name"] == case]
    assert (row["training_step"], row["numel"], row["event"], row["recorded"]) == (3, tensor.numel(), event, False)
    assert row["has_nan"] == (event == "nan") and row["has_inf"] == (event == "inf")
    if event is None:
        magnitude = tensor.abs().double()
        assert row["abs_max"] == pytest.approx(float(magnitude.max())) and row["norm"] == pytest.approx(
            float(torch.linalg.vector_norm(magnitude)))
    assert len(said) == (0 if event is None else 1)


def test_an_empty_batch_is_an_event_and_each_is_said_once() -> None:
    rows, said = _rows({"x": torch.ones(2)}, batch_size=0)
    (batch,) = [r for r in rows if r["name"] == "batch"]
    assert batch["event"] == "zero_batch" and batch["numel"] == 0 and len(said) == 1


def test_only_the_losses_and_outputs_by_default() -> None:
    sentinels = Sentinels(put=lambda table: None, warn=lambda key, message: None, note=lambda note: None)
    sentinels.learn_outputs({"nodes": [{"node": "logits", "role": "output", "roles": ["logits"]},
                                       {"node": "hidden", "role": "intermediate", "roles": ["hidden"]}]})
    sentinels.start_batch(0, None, 2, recorded=False)
    assert sentinels.wants("logits", False) and sentinels.wants("anything", True) and not sentinels.wants("hidden", False)
    sentinels.configure(None, enabled=False, pause_on_error=False)
    sentinels.start_batch(1, None, 2, recorded=False)
    assert not sentinels.wants("logits", False)


@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "kernel"])
def test_tensors_of_several_dtypes_in_one_step_each_against_its_own_reduction(kernel: bool) -> None:
    tensors = {"loss": torch.tensor(2.5), "logits": torch.tensor([[1.0, -7.0], [3.0, 0.25]], dtype=torch.bfloat16),
               "counts": torch.tensor([4, -9, 1]), "wide": torch.tensor([-1e300, 2.0], dtype=torch.float64),
               "nan_loss": torch.tensor(math.nan), "transposed": torch.randn(3, 5).t(),
               "large": torch.randn(70_000), "requires_grad": torch.randn(4, 3, requires_grad=True) * 2}
    rows, said = _rows(tensors, kernel=kernel)
    by_name = {r["name"]: r for r in rows}
    for name, tensor in tensors.items():
        row, tensor = by_name[name], tensor.detach()
        magnitude = tensor.abs().double()
        if name == "nan_loss":
            assert row["has_nan"] and row["event"] == "nan"
            continue
        assert row["event"] is None and row["numel"] == tensor.numel()
        assert row["abs_max"] == pytest.approx(float(magnitude.max()), rel=1e-6)
        assert row["norm"] == pytest.approx(float(torch.linalg.vector_norm(tensor.double() if not
                                                                           tensor.is_floating_point() else tensor)), rel=1e-2)
    assert len(said) == 1


def test_the_device_path_stacks_reductions_of_several_dtypes_and_reads_them_in_order() -> None:
    """On a GPU the reductions stay tensors until finish_batch stacks them (bfloat16 logits beside a float32 output
    become float64 there, on the device) and copies them; a CPU loss's floats sit between them. Run here with CPU
    tensors in the device path's place."""
    from comgra.breakpoints import sentinels as module

    tables: list[Any] = []
    sentinels = Sentinels(put=tables.append, warn=lambda key, message: None, note=lambda note: None)
    step = module._Step(7, "training", 2, recorded=False)
    step.names = [("logits", "output", 4), ("loss", "loss", 1), ("hidden", "marked", 3)]
    step.parts = [tuple(torch.tensor(v, dtype=torch.bfloat16) for v in (-3.0, 2.0, 4.0)), (0.5, 0.5, 0.5),
                  tuple(torch.tensor(v) for v in (-1.0, 8.0, 9.0))]
    module._start_transfer(step)
    assert step.host is not None and step.host.dtype == torch.float64 and step.host.shape == (6,)
    sentinels._read(step, pausable=False)
    sentinels.close()
    rows = {r["name"]: r for table in tables for r in table.to_pylist()}
    assert (rows["logits"]["abs_max"], rows["logits"]["norm"]) == (3.0, 4.0)
    assert (rows["loss"]["abs_max"], rows["loss"]["norm"]) == (0.5, 0.5)
    assert (rows["hidden"]["abs_max"], rows["hidden"]["norm"]) == (8.0, 9.0)
    assert rows["batch"]["numel"] == 2 and all(r["training_step"] == 7 for r in rows.values())


def test_integer_and_boolean_inputs_keep_their_extremes_without_a_copy_or_a_norm() -> None:
    """Token ids, masks and labels (``is_input``): the smallest and largest value of the integers as they are (the
    evidence of a zeroed or constant input), no norm; a float input keeps its norm."""
    tables: list[Any] = []
    sentinels = Sentinels(put=tables.append, warn=lambda key, message: None, note=lambda note: None)
    inputs = {"ids": torch.tensor([[5, 8191], [0, 17]]), "mask": torch.tensor([[True, False], [True, True]]),
              "labels": torch.tensor([-100, 3, 9], dtype=torch.int32), "pixels": torch.tensor([[-1.5, 0.25], [2.0, 1.0]])}
    sentinels.start_batch(2, "training", 2, recorded=False)
    for name, tensor in inputs.items():
        assert sentinels.wants(name, False, True)
        sentinels.register(name, tensor, False, True)
    sentinels.finish_batch(pausable=False)
    sentinels.close()
    rows = {r["name"]: r for table in tables for r in table.to_pylist()}
    for name, tensor in inputs.items():
        row, values = rows[name], tensor.double()
        assert (row["source"], row["numel"], row["event"]) == ("input", tensor.numel(), None)
        assert (row["value_min"], row["value_max"]) == (float(values.min()), float(values.max()))
        assert row["abs_max"] == float(values.abs().max())
        if tensor.is_floating_point():
            assert row["norm"] == pytest.approx(float(torch.linalg.vector_norm(values)))
        else:
            assert math.isnan(row["norm"])


def test_the_device_path_reads_integer_inputs_without_a_norm_in_order() -> None:
    """On a GPU an integer input's part is (min, max, None): two values in the stack, not three. Run here with CPU
    tensors in the device path's place."""
    from comgra.breakpoints import sentinels as module

    tables: list[Any] = []
    sentinels = Sentinels(put=tables.append, warn=lambda key, message: None, note=lambda note: None)
    step = module._Step(4, "training", 2, recorded=False)
    step.names = [("ids", "input", 6), ("logits", "output", 4), ("mask", "input", 6)]
    step.parts = [(torch.tensor(3), torch.tensor(70), None), tuple(torch.tensor(v) for v in (-2.0, 1.0, 5.0)),
                  (torch.tensor(False), torch.tensor(True), None)]
    module._start_transfer(step)
    assert step.host is not None and step.host.dtype == torch.float64 and step.host.shape == (7,)
    sentinels._read(step, pausable=False)
    sentinels.close()
    rows = {r["name"]: r for table in tables for r in table.to_pylist()}
    assert (rows["ids"]["value_min"], rows["ids"]["value_max"], rows["ids"]["abs_max"]) == (3.0, 70.0, 70.0)
    assert math.isnan(rows["ids"]["norm"]) and math.isnan(rows["mask"]["norm"])
    assert (rows["logits"]["value_min"], rows["logits"]["value_max"], rows["logits"]["norm"]) == (-2.0, 1.0, 5.0)
    assert (rows["mask"]["value_min"], rows["mask"]["value_max"]) == (0.0, 1.0)
    step = module._Step(5, "training", 2, recorded=False)  # integer inputs alone: their stack is made float64 too
    step.names, step.parts = [("ids", "input", 6)], [(torch.tensor(0), torch.tensor(0), None)]
    module._start_transfer(step)
    assert step.host is not None and step.host.dtype == torch.float64
    sentinels._read(step, pausable=False)
    sentinels.close()
    (row,) = [r for table in tables for r in table.to_pylist() if r["training_step"] == 5 and r["name"] == "ids"]
    assert (row["value_min"], row["value_max"]) == (0.0, 0.0)


def test_the_small_cpu_tensors_of_held_steps_are_reduced_in_one_kernel_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the kernel wired, registration keeps the tensor (no torch call), and all-CPU steps are held: every
    HOLD_STEPS steps their small tensors are reduced in one call, what the kernel cannot read (bfloat16) in torch; the
    rows are each step's own values, in order, and a tensor with autograd history is held detached. (The first step
    has no step before it: read at once.)"""
    from comgra.breakpoints import sentinels as module
    ticks = iter(range(1000))
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(ticks) * 0.001)  # a step every millisecond
    calls: list[int] = []
    tables: list[Any] = []
    sentinels = _with_kernel(Sentinels(put=tables.append, warn=lambda key, message: None, note=lambda note: None))
    reduce_many = sentinels.reduce_many
    assert reduce_many is not None
    sentinels.reduce_many = lambda specs: calls.append(len(specs)) or reduce_many(specs)
    sentinels.configure(None, enabled=True, pause_on_error=False)
    expected = {}
    for step in range(module.HOLD_STEPS + 2):
        sentinels.start_batch(step, "training", 8, recorded=False)
        inputs = torch.randn(8, 64) * (step + 1)
        sentinels.register("input", inputs, is_loss=False, is_input=True)
        sentinels.register("target", torch.randint(0, 10, (8,)), is_loss=False, is_input=True)
        sentinels.register("half", torch.randn(8, 2, dtype=torch.bfloat16), is_loss=False, is_input=True)
        weight = torch.tensor(0.5, requires_grad=True)
        sentinels.register("loss", weight * (step + 1), is_loss=True)
        assert sentinels.step is not None and not sentinels.step.pending[-1][1].requires_grad  # held detached
        expected[step] = (float(inputs.min()), float(inputs.max()), float(torch.linalg.vector_norm(inputs.double())))
        sentinels.finish_batch(pausable=False)
        assert calls == ([3] if step < module.HOLD_STEPS else [3, 3 * module.HOLD_STEPS])  # one call for 16 steps
    sentinels.flush()  # the last step: read at a flush (and at a pause, a recorded step and the run's end)
    assert calls == [3, 3 * module.HOLD_STEPS, 3]
    rows = [row for table in tables for row in table.to_pylist()]
    inputs_rows = [row for row in rows if row["name"] == "input"]
    assert [row["training_step"] for row in inputs_rows] == list(range(module.HOLD_STEPS + 2))
    for row in inputs_rows:
        low, high, norm = expected[row["training_step"]]
        assert (row["value_min"], row["value_max"]) == pytest.approx((low, high), rel=1e-6)
        assert row["norm"] == pytest.approx(norm, rel=1e-5)
    assert [row["value_max"] for row in rows if row["name"] == "loss"] == [0.5 * (s + 1) for s in range(18)]
    assert sentinels.events == []


def test_held_steps_are_read_after_hold_seconds_and_at_once_with_pause_on_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN on a held step is said once HOLD_SECONDS have passed since the first step held; a step that came more
    than HOLD_SECONDS after the last one (a slow training) is read at its own end, as is every step with
    pause_on_error."""
    from comgra.breakpoints import sentinels as module
    sentinels = _with_kernel(Sentinels(put=lambda table: None, warn=lambda key, message: None, note=lambda note: None))
    sentinels.configure(["x"], enabled=True, pause_on_error=False)
    clock = iter([10.0, 10.1, 10.2, 10.8, 11.9, 12.0])  # time.perf_counter() at each finish_batch
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(clock))
    expected = [[], [], [], [(1, "x", "nan")], [(1, "x", "nan"), (4, "x", "inf")]]
    for step, value in enumerate((1.0, math.nan, 2.0, 3.0, math.inf)):
        sentinels.start_batch(step, "training", 2, recorded=False)
        sentinels.register("x", torch.tensor([value, 2.0]), is_loss=False)
        sentinels.finish_batch(pausable=False)
        assert sentinels.events == expected[step], step  # step 3: 0.7 s after step 1; step 4: 1.1 s after step 3
    sentinels.configure(["x"], enabled=True, pause_on_error=True)
    sentinels.start_batch(5, "training", 2, recorded=False)
    sentinels.register("x", torch.tensor([-math.inf, 2.0]), is_loss=False)
    sentinels.finish_batch(pausable=True)  # 0.1 s after the last: read at once all the same
    assert sentinels.events[-1] == (5, "x", "inf")


def test_a_held_tensor_changed_in_place_after_its_step_is_reduced_at_registration_from_then_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An input buffer the user fills again at every step (``buffer.copy_(batch)``): held steps would all read its
    last values; its version counter shows the change when they are read, and from then on it is reduced at
    registration."""
    from comgra.breakpoints import sentinels as module
    ticks = iter(range(1000))
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(ticks) * 0.001)  # a step every millisecond
    tables: list[Any] = []
    sentinels = _with_kernel(Sentinels(put=tables.append, warn=lambda key, message: None, note=lambda note: None))
    sentinels.configure(["buffer"], enabled=True, pause_on_error=False)
    buffer = torch.zeros(4)
    for step in range(module.HOLD_STEPS + 3):
        buffer.copy_(torch.full((4,), float(step)))
        sentinels.start_batch(step, "training", 4, recorded=False)
        sentinels.register("buffer", buffer, is_loss=False)
        sentinels.finish_batch(pausable=False)
    sentinels.close()
    assert sentinels.in_place == {"buffer"}
    maxima = [row["value_max"] for table in tables for row in table.to_pylist() if row["name"] == "buffer"]
    assert maxima[module.HOLD_STEPS:] == [float(step) for step in range(module.HOLD_STEPS, module.HOLD_STEPS + 3)]


def test_a_tensor_changed_in_place_after_its_registration_is_read_at_registration_from_then_on() -> None:
    """Read at the step's end, a tensor changed in place later in the step would hide its registered value: its
    version counter shows it, and from the next step on its name is reduced at registration (a NaN mended in place
    after the registration is caught)."""
    sentinels = _with_kernel(Sentinels(put=lambda table: None, warn=lambda key, message: None, note=lambda note: None))
    sentinels.configure(["x"], enabled=True, pause_on_error=False)
    for step, value in enumerate((1.0, math.nan)):
        sentinels.start_batch(step, "training", 2, recorded=False)
        x = torch.tensor([value, 2.0])
        sentinels.register("x", x, is_loss=False)
        x.nan_to_num_(0.0).mul_(3)
        sentinels.finish_batch(pausable=False)
    assert sentinels.in_place == {"x"}  # seen at the step's end, not when the held steps are read
    sentinels.flush()
    assert sentinels.events == [(1, "x", "nan")]

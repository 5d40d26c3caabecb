"""Per-layer profiling (``track_module(..., profile=True)``) of a torch.compile'd model never stops compilation.

A compiled model runs as one graph whose modules cannot be timed one by one: its modules are measured on the
steps that run eagerly (the recorded steps, and the step that counts FLOPs: TorchDynamo would skip the model
for good if it met the FLOP counter's dispatch mode), the compiled steps have no rows, and comgra says so once.
Before, the FLOP counter on the first profiled step made Dynamo skip the model's frame: 0 frames compiled over
the whole run, silently.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import comgra

torch = pytest.importorskip("torch")

from comgra.capture.session import ComgraWarning  # noqa: E402
from comgra.objects import DecisionMakerForRecordingsHardcoded  # noqa: E402
from comgra.profiling.instruments import COMPILED_MESSAGE  # noqa: E402
from comgra.recorder import ComgraRecorder  # noqa: E402
from comgra.store import GroupReader  # noqa: E402

from compiled_training import BATCH, CONFIG, DynamoWatch, nano_gpt, train  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")]
STEPS = 8


def test_a_profiled_compiled_model_compiles_and_is_measured_on_its_eager_steps(tmp_path: Path) -> None:
    torch._dynamo.reset()
    recorder = ComgraRecorder(tmp_path, "group", "trial", DecisionMakerForRecordingsHardcoded({5}), flush_seconds=60.0,
                              resource_seconds=None)
    model = nano_gpt.make_gpt(CONFIG)
    recorder.track_module("gpt", model, profile=True)
    compiled = torch.compile(model)
    watch = DynamoWatch()
    with watch.watching(), pytest.warns(ComgraWarning, match="measured no module call") as warned:
        before = watch.counts()
        after: list[dict[str, int]] = []
        train(recorder, model, compiled, STEPS, after_step=lambda step: after.append(watch.counts()))
    recorder.finalize()
    assert [str(w.message) for w in warned if issubclass(w.category, ComgraWarning)] == [COMPILED_MESSAGE]
    assert after[0] == before, "step 0 counts FLOPs: it runs eagerly, nothing is traced"
    assert after[1]["graphs"] > before["graphs"], "the profiled model compiles from step 1 on"
    assert all(counts == after[1] for counts in after[2:]) and after[-1]["graph_breaks"] == before["graph_breaks"]
    assert watch.graph_breaks.messages == [] and watch.recompiles.messages == []

    rows = GroupReader(tmp_path / "group").trial("trial").layers().to_pylist()
    assert sorted({row["training_step"] for row in rows}) == [0, 5]  # the FLOPs step and the recorded step
    names = {name for name, module in model.named_modules() if not isinstance(module, torch.nn.ModuleList)}
    for step in (0, 5):
        assert {row["module"] for row in rows if row["training_step"] == step} == {
            f"gpt.{name}" if name else "gpt" for name in names}
    flops = {row["module"]: row["forward_flops"] for row in rows if row["training_step"] == 0}
    tokens, width = BATCH * CONFIG.block_size, CONFIG.n_embd
    assert flops["gpt.blocks.0.fc"] == 2 * tokens * width * 4 * width  # a Linear: 2 * rows * in * out
    ids, targets = nano_gpt.batches(CONFIG, BATCH, 1)[0]
    comgra.my_recorder = None  # the model without comgra
    with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
        model(ids, targets)
    assert flops["gpt"] == counter.get_total_flops()
    assert all(row["forward_flops"] is None for row in rows if row["training_step"] == 5)

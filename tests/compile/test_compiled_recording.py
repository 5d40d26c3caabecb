"""Recording a torch.compile'd model with ``register_tensor`` inside its forward (real inductor compiles).

The design (comgra.capture.compiled): a recorded step runs the compiled model eagerly ("force_eager"
stance from start_batch to finish_batch); on the other steps comgra's calls trace to nothing. Checked
here for ``torch.compile(model)``, ``model.compile()``, ``fullgraph=True`` and a compiled function:

- after warm-up (step 0 recorded, step 1 the first compile), steps alternating recorded / not recorded
  convert no frame (no recompilation: Dynamo's frame counter and its ``recompiles`` log) and no graph breaks
  at all (the counter and the ``graph_breaks`` log); the first unrecorded step compiles (so the unrecorded
  steps do run compiled code), the recorded step 0 before it compiles nothing;
- the recorded values and gradients equal those of an eager run of the same model, seed and data within
  1e-5 (relative to each tensor's largest magnitude), and the dependency graph (nodes and edges) is the
  eager run's.

Each variant compiles once (a few seconds to tens of seconds on a loaded machine), hence few tests.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from comgra.objects import DecisionMakerForRecordingsHardcoded  # noqa: E402
from comgra.recorder import ComgraRecorder  # noqa: E402
from comgra.store import GroupReader  # noqa: E402

from compiled_training import (  # noqa: E402
    CONFIG, DynamoWatch, assert_rows_match, graph_shape, nano_gpt, rows_by_key, train)

# torch's own modules warn while inductor loads (torch.jit.script_method is deprecated): theirs, not ours.
# TorchDynamo reads .grad of non-leaf inputs of a resume function while it traces (after the user's .item()).
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning:torch"),
              pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")]
STEPS = 8
RECORDED = {0, 2, 4, 6}  # step 0 recorded (eager), step 1 compiles, then recorded and not recorded take turns


def _recorder(root: Path, trial: str) -> ComgraRecorder:
    return ComgraRecorder(root, "group", trial, DecisionMakerForRecordingsHardcoded(RECORDED), flush_seconds=60.0,
                          resource_seconds=None)


@pytest.fixture(scope="module")
def eager_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[float]]:
    root = tmp_path_factory.mktemp("eager")
    recorder = _recorder(root, "eager")
    model = nano_gpt.make_gpt(CONFIG)
    recorder.track_module("gpt", model)
    losses = train(recorder, model, model, STEPS)
    recorder.finalize()
    return GroupReader(root / "group").trial("eager"), losses


def _compiled(variant: str, model: Any) -> Any:
    """The forward to train with: (ids, targets) -> loss."""
    if variant == "torch.compile":
        return torch.compile(model)
    if variant == "fullgraph":
        return torch.compile(model, fullgraph=True)
    if variant == "model.compile":
        model.compile()
        return model

    @torch.compile
    def loss_of(ids: Any, targets: Any) -> Any:  # a compiled function that calls the model
        return model(ids, targets)

    return loss_of


@pytest.mark.parametrize("variant", ["torch.compile", "fullgraph", "model.compile", "function"])
def test_recorded_steps_of_a_compiled_model_break_no_graph_compile_nothing_and_equal_eager(
        variant: str, tmp_path: Path, eager_run: tuple[Any, list[float]]) -> None:
    eager_trial, eager_losses = eager_run
    torch._dynamo.reset()  # this variant compiles its own code: its first compile is visible in the counters
    recorder = _recorder(tmp_path, "compiled")
    model = nano_gpt.make_gpt(CONFIG)
    recorder.track_module("gpt", model)
    forward = _compiled(variant, model)
    watch = DynamoWatch()
    with watch.watching():
        before = watch.counts()
        after: list[dict[str, int]] = []
        losses = train(recorder, model, forward, STEPS, after_step=lambda step: after.append(watch.counts()))
    recorder.finalize()

    assert after[0] == before, "the recorded step 0 ran the compiled model eagerly: nothing traced"
    assert after[1]["graphs"] > before["graphs"], "the first unrecorded step compiles the model"
    assert all(counts == after[1] for counts in after[2:]), f"recompiled after warm-up: {after}"
    assert after[-1]["graph_breaks"] == before["graph_breaks"]  # (the counter is cumulative over the process)
    assert watch.graph_breaks.messages == [] and watch.recompiles.messages == []

    trial = GroupReader(tmp_path / "group").trial("compiled")
    assert trial.steps()["training_step"].to_pylist() == sorted(RECORDED)
    for step in sorted(RECORDED):
        assert_rows_match(rows_by_key(trial, step), rows_by_key(eager_trial, step))
        assert graph_shape(trial, step) == graph_shape(eager_trial, step)
    nodes, edges = graph_shape(trial, 6)
    assert {f"block{i}_out" for i in range(CONFIG.n_layer)} <= {node for node, _ in nodes}
    assert ("block0_out", "block1_attn") in edges or any(source == "block0_out" for source, _ in edges)
    assert losses == pytest.approx(eager_losses, rel=1e-4)  # the unrecorded steps ran compiled code, same numbers


def test_where_the_users_code_breaks_the_graph_comgra_adds_no_break(tmp_path: Path) -> None:
    """A ``.item()`` of the user's after the first block breaks the graph; with comgra recording every other
    step, the compiled model has the graph breaks and graphs of the same model without comgra.

    Dynamo does not resume inside a loop: it runs the model's forward eagerly and compiles each block's
    forward as a frame of its own, shared by the blocks. Names built from ``self.index`` there would specialise
    that frame per block (one recompile per block: Python builds the name before comgra is called), so the
    blocks build them on recorded steps only, as the README advises (nano_gpt's names_on_recorded_steps_only)."""
    config = nano_gpt.GPTConfig(**{**CONFIG.__dict__, "item_after_first_block": True,
                                   "names_on_recorded_steps_only": True})

    def run(trial: str, with_comgra: bool) -> tuple[dict[str, int], list[dict[str, int]], DynamoWatch]:
        torch._dynamo.reset()
        recorder = _recorder(tmp_path, trial) if with_comgra else ComgraRecorder(
            tmp_path, "group", trial, DecisionMakerForRecordingsHardcoded(set()), comgra_is_active=False)
        model = nano_gpt.make_gpt(config)
        compiled = torch.compile(model)
        watch = DynamoWatch()
        after: list[dict[str, int]] = []
        with watch.watching():
            before = watch.counts()
            train(recorder, model, compiled, STEPS, after_step=lambda step: after.append(watch.counts()))
        recorder.finalize()
        return before, after, watch

    plain_before, plain_after, plain_watch = run("plain", with_comgra=False)
    before, after, watch = run("comgra", with_comgra=True)
    assert all(counts == after[1] for counts in after[2:]) and watch.recompiles.messages == []
    for name in ("graphs", "graph_breaks"):
        assert after[-1][name] - before[name] == plain_after[-1][name] - plain_before[name]
    assert len(watch.graph_breaks.messages) == len(plain_watch.graph_breaks.messages) >= 1  # the user's .item()
    assert all("item" in message for message in watch.graph_breaks.messages)
    trial = GroupReader(tmp_path / "group").trial("comgra")
    assert {f"block{i}_out" for i in range(CONFIG.n_layer)} <= {
        row["tensor_name"] for row in trial.selection(training_step=6).to_pylist()}

"""``comgra.watch`` and the Lightning callback on torch.compile'd models (real inductor compiles).

Both record what the same model records eagerly (values, gradients, the graph), break no graph and compile
nothing after warm-up: ``comgra.watch``'s hooks are on the modules during recorded steps only, which run
eagerly; the Lightning callback starts comgra's step in ``on_train_batch_start``, outside the compiled model.
(The transformers callback is not here: its hooks sit on the model, inside the graph the Trainer's
``torch_compile=True`` compiles; see the README.)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import comgra  # noqa: E402
from comgra.objects import DecisionMakerForRecordingsHardcoded  # noqa: E402
from comgra.recorder import ComgraRecorder  # noqa: E402
from comgra.store import GroupReader  # noqa: E402

from compiled_training import CONFIG, DynamoWatch, assert_rows_match, graph_shape, nano_gpt, rows_by_key, train  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")]
RECORDED = {0, 2, 4}
STEPS = 6


def _assert_compiled_once(before: dict[str, int], after: list[dict[str, int]], watch: DynamoWatch) -> None:
    assert after[0] == before, "the recorded step 0 ran eagerly: nothing traced"
    assert after[1]["graphs"] > before["graphs"], "the first unrecorded step compiles the model"
    assert all(counts == after[1] for counts in after[2:]), f"compiled after warm-up: {after}"
    assert after[-1]["graph_breaks"] == before["graph_breaks"]
    assert watch.graph_breaks.messages == [] and watch.recompiles.messages == []


def _watched_run(root: Path, trial: str, compiled: bool) -> tuple[list[dict[str, int]], dict[str, int], DynamoWatch]:
    torch._dynamo.reset()
    recorder = ComgraRecorder(root, "group", trial, DecisionMakerForRecordingsHardcoded(RECORDED), flush_seconds=60.0,
                              resource_seconds=None)
    model = nano_gpt.make_gpt(CONFIG)
    comgra.watch(model, recorder=recorder, name="gpt")  # beside the model's own register_tensor calls
    forward = torch.compile(model) if compiled else model
    watch = DynamoWatch()
    after: list[dict[str, int]] = []
    with watch.watching():
        before = watch.counts()
        train(recorder, model, forward, STEPS, after_step=lambda step: after.append(watch.counts()))
    recorder.finalize()
    return after, before, watch


def test_comgra_watch_on_a_compiled_model(tmp_path: Path) -> None:
    _watched_run(tmp_path, "eager", compiled=False)
    after, before, watch = _watched_run(tmp_path, "compiled", compiled=True)
    _assert_compiled_once(before, after, watch)
    group = GroupReader(tmp_path / "group")
    eager, compiled = group.trial("eager"), group.trial("compiled")
    for step in sorted(RECORDED):
        assert_rows_match(rows_by_key(compiled, step), rows_by_key(eager, step))
        assert graph_shape(compiled, step) == graph_shape(eager, step)
    nodes, edges = graph_shape(compiled, 4)
    names = {node for node, _ in nodes}
    assert {"gpt.blocks.0", "gpt.blocks.1.attn", "gpt.lm_head", "block0_out"} <= names  # watched and registered
    assert ("gpt.blocks.0", "gpt.blocks.1.ln_1") in edges


@pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning")
@pytest.mark.filterwarnings("ignore:.*GPU available but not used.*:UserWarning")
@pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning")
def test_the_lightning_callback_on_a_compiled_module(tmp_path: Path) -> None:
    lightning = pytest.importorskip("lightning")
    from comgra.integrations.lightning import ComgraCallback

    class Regression(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                self.layer0, self.layer1 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer1(torch.tanh(self.layer0(x)))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    generator = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(4 * STEPS, 4, generator=generator),
                                          torch.randn(4 * STEPS, 1, generator=generator))
    watch = DynamoWatch()
    after: list[dict[str, int]] = []

    class Counts(lightning.Callback):
        def on_train_batch_end(self, *arguments: Any) -> None:
            after.append(watch.counts())

    def fit(trial: str, compiled: bool) -> dict[str, int]:
        torch._dynamo.reset()
        module = Regression()
        callback = ComgraCallback(tmp_path, "pl", trial, DecisionMakerForRecordingsHardcoded(RECORDED),
                                  flush_seconds=60.0)
        trainer = lightning.Trainer(default_root_dir=str(tmp_path / "out"), accelerator="cpu", devices=1, logger=False,
                                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                    max_epochs=1, callbacks=[callback, Counts()])
        before = watch.counts()
        trainer.fit(torch.compile(module) if compiled else module,
                    torch.utils.data.DataLoader(data, batch_size=4, shuffle=False))
        return before

    fit("eager", compiled=False)
    after.clear()
    with watch.watching():
        before = fit("compiled", compiled=True)
    _assert_compiled_once(before, after, watch)
    group = GroupReader(tmp_path / "pl")
    eager, compiled = group.trial("eager"), group.trial("compiled")
    assert compiled.steps()["training_step"].to_pylist() == sorted(RECORDED)
    for step in sorted(RECORDED):
        rows = rows_by_key(compiled, step)
        assert_rows_match(rows, rows_by_key(eager, step))
        assert {"model.layer0", "model.layer1", "loss"} <= {key[2] for key in rows}
        assert any(key[0] == "gradients" and key[2] == "model.layer0.weight" for key in rows)

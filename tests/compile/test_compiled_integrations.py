"""``comgra.watch`` and the two callbacks on torch.compile'd models (real inductor compiles).

Each records what the same model records eagerly (values, gradients, the graph), adds no graph break and
compiles nothing after warm-up: ``comgra.watch``'s hooks are on the modules during recorded steps only, which
run eagerly; the Lightning callback starts comgra's step in ``on_train_batch_start``, outside the compiled
model; the transformers callback, whose hooks sit on the model inside the graph that ``torch_compile=True``
compiles (there they trace to nothing), starts the step in ``on_step_begin``.
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


@pytest.mark.filterwarnings("ignore::FutureWarning:transformers")
@pytest.mark.filterwarnings("ignore::UserWarning:transformers")
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")  # Dynamo's, tracing
def test_the_transformers_callback_with_torch_compile(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from comgra.integrations.transformers import ComgraCallback

    transformers.utils.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=32, n_positions=16, bos_token_id=0,
                                     eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    ids = torch.randint(0, 32, (4 * STEPS, 6), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]
    watch = DynamoWatch()
    after: list[dict[str, int]] = []

    class Counts(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *arguments: Any, **kwargs: Any) -> None:
            after.append(watch.counts())

    def train_(trial: str, compiled: bool) -> dict[str, int]:
        torch._dynamo.reset()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = transformers.GPT2LMHeadModel(config)
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_train_epochs=1, learning_rate=0.1,
            optim="sgd", lr_scheduler_type="constant", use_cpu=True, report_to=[], save_strategy="no",
            logging_steps=1, disable_tqdm=True, seed=0, torch_compile=compiled)
        callback = ComgraCallback(tmp_path, "hf", trial, DecisionMakerForRecordingsHardcoded(RECORDED),
                                  flush_seconds=60.0)
        before = watch.counts()
        transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback, Counts()]).train()
        return before

    train_("eager", compiled=False)
    after.clear()
    with watch.watching():
        before = train_("compiled", compiled=True)
    assert after[0] == before, "the recorded step 0 ran eagerly: nothing traced"
    assert after[1]["graphs"] > before["graphs"] and all(counts == after[1] for counts in after[2:]), after
    assert watch.recompiles.messages == []
    for message in watch.graph_breaks.messages:  # transformers' own (a logger call in its model code), not comgra's
        assert "/transformers/" in message.splitlines()[0] and "comgra" not in message, message
    group = GroupReader(tmp_path / "hf")
    eager, compiled = group.trial("eager"), group.trial("compiled")
    assert compiled.steps()["training_step"].to_pylist() == sorted(RECORDED)
    for step in sorted(RECORDED):
        rows = rows_by_key(compiled, step)
        assert_rows_match(rows, rows_by_key(eager, step))
        assert graph_shape(compiled, step) == graph_shape(eager, step)
        assert {"model.transformer.h.0", "loss"} <= {key[2] for key in rows}
        assert any(key[0] == "gradients" and key[2] == "model.transformer.h.0.mlp.c_fc.weight" for key in rows)

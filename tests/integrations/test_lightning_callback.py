"""ComgraCallback in the real lightning.Trainer: recorded values against values the test computes itself."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
lightning = pytest.importorskip("lightning")

from comgra.integrations.lightning import ComgraCallback
from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.service import RecordingService

pytestmark = [  # Lightning's advice about this tiny CPU setup (worker processes, logging), not comgra's
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
    pytest.mark.filterwarnings("ignore:.*GPU available but not used.*:UserWarning"),
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning"),  # lightning on torch 2.13
]
LR = 0.1
WEIGHT = "model.layer0.weight"


class Regression(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.layer0 = torch.nn.Linear(4, 8)
            self.layer1 = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer1(torch.tanh(self.layer0(x)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=LR)


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=generator), torch.randn(n, 1, generator=generator)


def _loader(x: torch.Tensor, y: torch.Tensor) -> Any:
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4, shuffle=False)


def _fit(tmp_path: Path, model: Any, callback: ComgraCallback, train: tuple, validation: tuple | None = None,
         **arguments: Any) -> Any:
    trainer = lightning.Trainer(default_root_dir=str(tmp_path / "out"), accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                num_sanity_val_steps=0, callbacks=[callback], **arguments)
    trainer.fit(model, _loader(*train), _loader(*validation) if validation else None)
    return trainer


def _rows(store: Path, step: int, **filters: Any) -> list[dict[str, Any]]:
    service = RecordingService(store / "pl")
    try:
        return service.tensor_rows("t", step, **filters).to_pylist()
    finally:
        service.close()


def _neurons(store: Path, step: int, kind: str) -> torch.Tensor:
    (row,) = _rows(store, step, node=WEIGHT, kind=kind)
    return torch.tensor(row["neurons"])


def test_gradients_are_this_steps_accumulated_ones(tmp_path: Path) -> None:
    """12 samples, batches of 4, accumulate_grad_batches=2: step 0 adds up batches 0 and 1, step 1 is the
    ragged last one (batch 2 alone). Each recorded gradient is what SGD applied in that step, element by
    element: (weight before - weight after) / lr, never the previous step's."""
    model, train = Regression(), _data(12, seed=1)
    initial = model.layer0.weight.detach().clone()
    with torch.no_grad():
        first_loss = float(torch.nn.functional.mse_loss(model(train[0][:4]), train[1][:4])) / 2
    callback = ComgraCallback(tmp_path / "store", "pl", "t", DecisionMakerForRecordingsHardcoded({0, 1}),
                              flush_seconds=0.05)
    _fit(tmp_path, model, callback, train, max_epochs=1, accumulate_grad_batches=2)
    store = tmp_path / "store"
    weights = [_neurons(store, 0, "forward"), _neurons(store, 1, "forward"), model.layer0.weight.detach().flatten()]
    assert torch.allclose(weights[0], initial.flatten())  # the parameters before the step
    for step in (0, 1):
        applied = (weights[step] - weights[step + 1]) / LR
        assert torch.allclose(_neurons(store, step, "gradients"), applied, rtol=1e-3, atol=1e-6), step
    assert not torch.allclose(_neurons(store, 0, "gradients"), _neurons(store, 1, "gradients"), atol=1e-4)
    losses = {(r["training_step"], r["iteration"]): r["mean"] for s in (0, 1)
              for r in _rows(store, s, node="loss", kind="forward")}
    assert sorted(losses) == [(0, 0), (0, 1), (1, 0)]  # one iteration per batch of the step
    assert losses[(0, 0)] == pytest.approx(first_loss, rel=1e-5)  # as backpropagated: divided by 2
    samples = {(r["training_step"], r["aggregation"]) for s in (0, 1) for r in _rows(store, s, node="model.layer0")}
    assert {(0, "sample"), (1, "sample")} <= samples


def test_validation_runs_are_their_own_type_of_step(tmp_path: Path) -> None:
    model, validation = Regression(), _data(4, seed=3)
    callback = ComgraCallback(tmp_path / "store", "pl", "t", DecisionMakerForRecordingsHardcoded(range(10)),
                              flush_seconds=0.05)
    _fit(tmp_path, model, callback, _data(8, seed=2), validation, max_epochs=2)
    service = RecordingService(tmp_path / "store" / "pl")
    try:
        steps = {(r["training_step"], r["type_of_execution"]) for r in service.group.trial("t").steps().to_pylist()}
    finally:
        service.close()
    # One numbering, Lightning's global_step: the validation after optimizer step 1 is step 2 of type "evaluation",
    # beside training step 2.
    assert steps == {(0, "training"), (1, "training"), (2, "evaluation"), (2, "training"), (3, "training"),
                     (4, "evaluation")}
    with torch.no_grad():
        expected = float(torch.nn.functional.mse_loss(model(validation[0]), validation[1]))
    (recorded,) = _rows(tmp_path / "store", 4, node="loss", kind="forward", type_of_execution="evaluation")
    assert recorded["mean"] == pytest.approx(expected, rel=1e-5)  # the final weights' validation loss
    assert {r["kind"] for r in _rows(tmp_path / "store", 2, node="model.layer0", type_of_execution="evaluation")} \
        == {"forward"}
    assert "gradients" in {r["kind"] for r in _rows(tmp_path / "store", 2, node="model.layer0.weight",
                                                     type_of_execution="training")}


def test_unrecorded_steps_and_the_end_of_fit(tmp_path: Path) -> None:
    model = Regression()
    callback = ComgraCallback(tmp_path / "store", "pl", "t", DecisionMakerForRecordingsHardcoded({2}),
                              flush_seconds=0.05)
    _fit(tmp_path, model, callback, _data(16, seed=4), max_epochs=1)
    service = RecordingService(tmp_path / "store" / "pl")
    try:
        trial = service.group.trial("t")
        assert {r["training_step"] for r in trial.steps().to_pylist()} == {2}
        sentinels = [r for r in trial.evidence("sentinels").to_pylist() if r["name"] == "loss"]
        runinfo = trial.evidence("runinfo").to_pylist()
    finally:
        service.close()
    assert sum(len(m._forward_hooks) for m in model.modules()) == 0
    # The sentinels saw the loss of every step, recorded or not; the recorded step knows the optimizer's groups.
    assert [(r["training_step"], r["recorded"]) for r in sentinels] == [(0, False), (1, False), (2, True), (3, False)]
    groups = {r["name"]: r["value"] for r in runinfo if r["field"] == "optimizer_group"}
    assert groups and all(groups.values())
    assert {r["value"] for r in runinfo if r["field"] == "lr"} == {str(LR)}


def test_gradients_are_recorded_before_clipping(tmp_path: Path) -> None:
    """gradient_clip_val clips after on_before_optimizer_step: the recorded gradient is the unclipped one, and
    Lightning's clipping (by the total norm, with torch's 1e-6) turns it into the update SGD applied."""
    model, train = Regression(), _data(8, seed=5)
    before = model.layer0.weight.detach().flatten().clone()
    callback = ComgraCallback(tmp_path / "store", "pl", "t", DecisionMakerForRecordingsHardcoded({0}),
                              flush_seconds=0.05)
    _fit(tmp_path, model, callback, train, max_epochs=1, accumulate_grad_batches=2, gradient_clip_val=1e-2,
         gradient_clip_algorithm="norm")
    applied = (before - model.layer0.weight.detach().flatten()) / LR
    recorded = _neurons(tmp_path / "store", 0, "gradients")
    total = torch.linalg.vector_norm(torch.cat([torch.tensor(r["neurons"]) for p in (
        "model.layer0.weight", "model.layer0.bias", "model.layer1.weight", "model.layer1.bias")
        for r in _rows(tmp_path / "store", 0, node=p, kind="gradients")]))
    assert float(recorded.norm()) > 10 * float(applied.norm())
    # atol: the float32 rounding of weight - lr * gradient, in units of the gradient
    assert torch.allclose(recorded * (1e-2 / (total + 1e-6)), applied, rtol=1e-3, atol=1e-6)


PRECISIONS = {  # Lightning turns precision="16-mixed" on CPU into bf16; its MixedPrecision plugin with a scaler runs
    "bf16-mixed": (dict(precision="bf16-mixed"), torch.bfloat16, None),
    "16-mixed-with-GradScaler": (dict(plugins="16-mixed"), torch.float16, 1024.0),
}


@pytest.mark.parametrize("precision", PRECISIONS, ids=PRECISIONS)
def test_mixed_precision_gradients_are_unscaled_and_accumulated(tmp_path: Path, precision: str) -> None:
    """8 samples, batches of 4, accumulate_grad_batches=2, under autocast (bf16, or fp16 with a real
    torch.amp.GradScaler in Lightning's MixedPrecision plugin). The recorded parameter gradient is the one SGD
    applied (the plugin unscaled it before on_before_optimizer_step: not divided twice); the recorded gradient
    of layer0's output is the one this test computes in its own autocast run, unscaled; the loss is recorded
    unscaled."""
    from lightning.pytorch.plugins import MixedPrecision

    arguments, dtype, scale = PRECISIONS[precision]
    if "plugins" in arguments:
        arguments = dict(plugins=[MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=scale))])
    model, (x, y) = Regression(), _data(8, seed=6)
    replica, hidden_grads, losses = Regression(), [], []
    for i in (0, 1):
        with torch.autocast("cpu", dtype=dtype, cache_enabled=False):
            hidden = replica.layer0(x[4 * i:4 * i + 4])
            loss = torch.nn.functional.mse_loss(replica.layer1(torch.tanh(hidden)), y[4 * i:4 * i + 4]) / 2
        hidden.retain_grad()
        (loss * (scale or 1.0)).backward()
        hidden_grads.append(hidden.grad.float() / (scale or 1.0))
        losses.append(float(loss.detach()))
    before = model.layer0.weight.detach().flatten().clone()
    callback = ComgraCallback(tmp_path / "store", "pl", "t", DecisionMakerForRecordingsHardcoded({0}),
                              flush_seconds=0.05)
    trainer = _fit(tmp_path, model, callback, (x, y), max_epochs=1, accumulate_grad_batches=2, **arguments)
    assert trainer.global_step == 1 and (scale is None) == (trainer.precision_plugin.scaler is None)
    store = tmp_path / "store"
    applied = (before - model.layer0.weight.detach().flatten()) / LR
    recorded = _neurons(store, 0, "gradients")
    assert torch.allclose(recorded, applied, rtol=1e-3, atol=1e-5)
    assert torch.allclose(recorded, replica.layer0.weight.grad.flatten() / (scale or 1.0), rtol=1e-3, atol=1e-6)
    for iteration, expected in enumerate(hidden_grads):
        rows = {r["sample"]: r["neurons"] for r in _rows(store, 0, node="model.layer0", kind="gradients")
                if r["iteration"] == iteration and r["aggregation"] == "sample"}
        assert sorted(rows) == [0, 1, 2, 3]
        assert torch.allclose(torch.tensor([rows[s] for s in range(4)]), expected, rtol=1e-3, atol=1e-6), iteration
    recorded_losses = {r["iteration"]: r["mean"] for r in _rows(store, 0, node="loss", kind="forward")}
    assert recorded_losses == {0: pytest.approx(losses[0], rel=1e-3), 1: pytest.approx(losses[1], rel=1e-3)}


class WithHyperparameters(Regression):
    def __init__(self, width: int = 8, optimizer: dict | None = None, layers: tuple = (8, 4)) -> None:
        super().__init__()
        self.save_hyperparameters()


def test_hparams_are_the_trials_hyperparameters(tmp_path: Path) -> None:
    callback = ComgraCallback(tmp_path / "store", "pl", "t", DecisionMakerForRecordingsHardcoded({0}),
                              flush_seconds=0.05)
    _fit(tmp_path, WithHyperparameters(width=16, optimizer={"name": "sgd", "lr": LR}), callback, _data(8, seed=4),
         max_epochs=1)
    service = RecordingService(tmp_path / "store" / "pl")
    try:
        (run,) = service.runs().runs
    finally:
        service.close()
    assert run.hyperparameters == {"width": 16, "optimizer.name": "sgd", "optimizer.lr": LR, "layers": "[8, 4]"}

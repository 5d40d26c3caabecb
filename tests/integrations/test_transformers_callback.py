"""ComgraCallback in the real transformers.Trainer: recorded values against values the test computes itself."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from comgra.errors import ConfigError
from comgra.integrations.transformers import ComgraCallback
from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.service import RecordingService

T = 6
PARAMETER = "model.transformer.h.0.mlp.c_fc.weight"


def _model() -> Any:
    transformers.utils.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=32, n_positions=16, bos_token_id=0,
                                     eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(config)


def _data(n: int, seed: int) -> list[dict[str, Any]]:
    ids = torch.randint(0, 32, (n, T), generator=torch.Generator().manual_seed(seed))
    return [{"input_ids": row, "labels": row} for row in ids]


def _train(tmp_path: Path, model: Any, train: list, callback: ComgraCallback, **arguments: Any) -> Any:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, per_device_eval_batch_size=4,
        num_train_epochs=1, learning_rate=0.1, optim="sgd", lr_scheduler_type="constant", use_cpu=True,
        report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0, **arguments)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=train,
                                   eval_dataset=arguments.get("eval_strategy") and _data(4, seed=9),
                                   callbacks=[callback])
    trainer.train()
    return trainer


def _rows(store: Path, step: int, **filters: Any) -> list[dict[str, Any]]:
    service = RecordingService(store / "hf")
    try:
        return service.tensor_rows("t", step, **filters).to_pylist()
    finally:
        service.close()


def _stored_gradient(store: Path) -> dict[str, float]:
    (row,) = _rows(store, 0, node=PARAMETER, kind="gradients")
    return row


def _assert_statistics(row: dict[str, Any], gradient: torch.Tensor) -> None:
    assert row["abs_mean"] == pytest.approx(float(gradient.abs().mean()), rel=1e-4)
    assert row["abs_max"] == pytest.approx(float(gradient.abs().max()), rel=1e-4)
    assert row["std"] == pytest.approx(float(gradient.std(unbiased=False)), rel=1e-4)


def test_accumulated_gradients_of_a_ragged_step_are_the_optimizers(tmp_path: Path) -> None:
    """6 samples, batches of 4, accumulation 2: one optimizer step of a micro-batch of 4 and one of 2. The
    recorded parameter gradient is the one plain SGD applied: (weight before - weight after) / lr."""
    model, train = _model(), _data(6, seed=1)
    clipped_model = copy.deepcopy(model)
    before = model.transformer.h[0].mlp.c_fc.weight.detach().clone()
    callback = ComgraCallback(tmp_path / "store", "hf", "t", DecisionMakerForRecordingsHardcoded({0}),
                              flush_seconds=0.05)
    trainer = _train(tmp_path, model, train, callback, gradient_accumulation_steps=2, max_grad_norm=0.0)
    applied = (before - model.transformer.h[0].mlp.c_fc.weight.detach()) / 0.1
    store = tmp_path / "store"
    _assert_statistics(_stored_gradient(store), applied)
    (value,) = _rows(store, 0, node=PARAMETER, kind="forward")
    assert value["abs_mean"] == pytest.approx(float(before.abs().mean()), rel=1e-5)  # before the optimizer step
    losses = {r["iteration"]: r["mean"] for r in _rows(store, 0, node="loss", kind="forward")}
    assert sorted(losses) == [0, 1]  # one iteration per micro-batch
    (logged,) = [e for e in trainer.state.log_history if "loss" in e]
    assert sum(losses.values()) == pytest.approx(logged["loss"], rel=1e-5)  # each micro-batch's share
    per_sample = {(r["iteration"], r["aggregation"]) for r in _rows(store, 0, node="model.transformer.h.1")}
    assert (0, "sample") in per_sample and (1, "sample") not in per_sample  # the ragged micro-batch: batch of 2

    # The same step with clipping: the gradient is read before the Trainer clips it (as the README says):
    # the raw one again, while SGD applied the clipped one.
    callback = ComgraCallback(tmp_path / "clipped", "hf", "t", DecisionMakerForRecordingsHardcoded({0}),
                              flush_seconds=0.05)
    before = clipped_model.transformer.h[0].mlp.c_fc.weight.detach().clone()
    _train(tmp_path, clipped_model, train, callback, gradient_accumulation_steps=2, max_grad_norm=1e-3)
    _assert_statistics(_stored_gradient(tmp_path / "clipped"), applied)
    clipped = (before - clipped_model.transformer.h[0].mlp.c_fc.weight.detach()) / 0.1
    assert float(clipped.abs().max()) < float(applied.abs().max()) / 100  # clipping happened, after the reading


def test_evaluation_runs_are_their_own_type_of_step(tmp_path: Path) -> None:
    """comgra's step numbers are the Trainer's global_step with evaluation on: the evaluation logged at global_step g
    is comgra's step g of type "evaluation", beside training step g (the optimizer step run while global_step is g,
    whose loss is logged at g + 1). Each (step, type) reads its own rows."""
    model = _model()
    callback = ComgraCallback(tmp_path / "store", "hf", "t", DecisionMakerForRecordingsHardcoded(range(10)),
                              flush_seconds=0.05)
    trainer = _train(tmp_path, model, _data(12, seed=2), callback, eval_strategy="steps", eval_steps=1)
    service = RecordingService(tmp_path / "store" / "hf")
    try:
        steps = {(r["training_step"], r["type_of_execution"]) for r in service.group.trial("t").steps().to_pylist()}
        kpis = service.kpis("t").to_pylist()
    finally:
        service.close()
    store = tmp_path / "store"
    assert steps == {(0, "training"), (1, "evaluation"), (1, "training"), (2, "evaluation"), (2, "training"),
                     (3, "evaluation")}
    evaluations = {e["step"]: e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e}
    assert sorted(evaluations) == [s for s, kind in sorted(steps) if kind == "evaluation"]  # one numbering
    for step, eval_loss in evaluations.items():  # one batch of 4: the run's loss is the batch's
        (row,) = _rows(store, step, node="loss", kind="forward", type_of_execution="evaluation")
        assert row["mean"] == pytest.approx(eval_loss, rel=1e-5)
        assert row["type_of_execution"] == "evaluation"
    losses = {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}
    for step in (0, 1, 2):  # logging_steps=1, no accumulation: the loss logged at g + 1 is training step g's
        (row,) = _rows(store, step, node="loss", kind="forward", type_of_execution="training")
        assert row["mean"] == pytest.approx(losses[step + 1], rel=1e-4)
    # The step numbers evaluation and training share hold each their own rows: gradients only in training.
    assert {r["kind"] for r in _rows(store, 1, node="model.transformer.h.0", type_of_execution="evaluation")} \
        == {"forward"}
    assert "gradients" in {r["kind"] for r in _rows(store, 1, node=PARAMETER, type_of_execution="training")}
    logged = {(k["kpi_group"], k["timepoint"]) for k in kpis}
    assert {("loss", 1), ("loss", 2), ("eval_loss", 1), ("eval_loss", 2), ("eval_loss", 3)} <= logged


class _DropoutLeftOnInEvaluation(transformers.Trainer):  # type: ignore[misc]
    """A planted bug: each evaluation batch runs with the model back in training mode (dropout on)."""

    def prediction_step(self, model: Any, *arguments: Any, **kwargs: Any) -> Any:
        model.train()
        return super().prediction_step(model, *arguments, **kwargs)


@pytest.mark.parametrize("planted", [False, True])
def test_the_scan_sees_an_evaluation_beside_the_training_step_of_its_number(tmp_path: Path, planted: bool) -> None:
    """With dropout in the model (GPT-2's default 0.1): the scan tells the evaluation at global_step g from training
    step g. Before (step, type) phases, the training step's dropout in training mode was charged to the evaluation
    of its number: a false "dropout in training mode on evaluation steps" error on a healthy run."""
    from comgra.analysis.scan import Scanner

    transformers.utils.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=32, n_positions=16, bos_token_id=0,
                                     eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    callback = ComgraCallback(tmp_path / "store", "hf", "t", DecisionMakerForRecordingsHardcoded(range(10)),
                              flush_seconds=0.05)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, per_device_eval_batch_size=4,
        num_train_epochs=1, learning_rate=0.01, use_cpu=True, report_to=[], save_strategy="no", logging_steps=1,
        disable_tqdm=True, seed=0, eval_strategy="steps", eval_steps=2)
    trainer_class = _DropoutLeftOnInEvaluation if planted else transformers.Trainer
    trainer = trainer_class(model=model, args=args, train_dataset=_data(16, seed=5), eval_dataset=_data(4, seed=6),
                            callbacks=[callback])
    trainer.train()
    evaluated = [e["step"] for e in trainer.state.log_history if "eval_loss" in e]
    assert evaluated == [2, 4]
    findings = Scanner().scan(tmp_path / "store" / "hf").findings
    dropout = [f for f in findings if f.evidence.get("problem") == "dropout_train_in_evaluation"]
    if planted:
        assert dropout and dropout[0].severity == "error" and dropout[0].training_step == 2  # the first evaluation
    else:
        assert dropout == [], [f.message for f in dropout]


def test_unrecorded_steps_leave_no_steps_and_hooks_come_off(tmp_path: Path) -> None:
    model = _model()
    callback = ComgraCallback(tmp_path / "store", "hf", "t", DecisionMakerForRecordingsHardcoded({1}),
                              flush_seconds=0.05)
    _train(tmp_path, model, _data(12, seed=3), callback)
    service = RecordingService(tmp_path / "store" / "hf")
    try:
        trial = service.group.trial("t")
        assert {r["training_step"] for r in trial.steps().to_pylist()} == {1}
        sentinels = [r for r in trial.evidence("sentinels").to_pylist() if r["name"] == "loss"]
        runinfo = trial.evidence("runinfo").to_pylist()
    finally:
        service.close()
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == 0
    # The sentinels saw the loss of every step, recorded or not; the recorded step knows the Trainer's optimizer.
    assert [(r["training_step"], r["recorded"]) for r in sentinels] == [(0, False), (1, True), (2, False)]
    (recorded_loss,) = _rows(tmp_path / "store", 1, node="loss", kind="forward")
    assert sentinels[1]["abs_max"] == pytest.approx(abs(recorded_loss["mean"]), rel=1e-5)
    groups = {r["name"]: r["value"] for r in runinfo if r["field"] == "optimizer_group"}
    assert PARAMETER in groups and all(groups.values())  # every parameter in a group of the Trainer's optimizer


def test_comgra_off_adds_no_hooks_and_writes_nothing(tmp_path: Path) -> None:
    model = _model()
    callback = ComgraCallback(tmp_path / "store", "hf", "t", DecisionMakerForRecordingsHardcoded({0}),
                              comgra_is_active=False)
    hooks: list[int] = []
    original = callback.on_step_begin

    def on_step_begin(*arguments: Any, **kwargs: Any) -> Any:
        hooks.append(sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()))
        return original(*arguments, **kwargs)

    callback.on_step_begin = on_step_begin
    _train(tmp_path, model, _data(4, seed=4), callback)
    assert hooks == [0] and not (tmp_path / "store").exists()


def test_misuse_is_reported_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"watch='yes' must be True, False or a dict"):
        ComgraCallback(tmp_path, watch="yes")
    with pytest.raises(ConfigError, match=r"either recorder=\.\.\. or the arguments to make one \(trial_id\)"):
        ComgraCallback(recorder=_FakeRecorder(), trial_id="x")


class _FakeRecorder:
    pass


def test_a_fault_of_comgras_own_warns_once_and_training_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from comgra.integrations.steps import IntegrationWarning, StepDriver

    def broken(self: StepDriver, *arguments: Any) -> None:
        raise RuntimeError("planted")

    monkeypatch.setattr(StepDriver, "gradients_and_finish", broken)
    model = _model()
    callback = ComgraCallback(tmp_path / "store", "hf", "t", DecisionMakerForRecordingsHardcoded({0, 1, 2}),
                              flush_seconds=0.05)
    with pytest.warns(IntegrationWarning, match=r"Trainer callback stopped recording .* RuntimeError: planted") as caught:
        trainer = _train(tmp_path, model, _data(12, seed=5), callback)
    assert len([w for w in caught if issubclass(w.category, IntegrationWarning)]) == 1
    assert trainer.state.global_step == 3  # every step trained


SCALE = 1024.0


def _ln_f_gradients(model: Any) -> tuple[list[Any], Any]:
    """The raw gradient of ``transformer.ln_f``'s output in each backward pass, caught by the test's own hook."""
    caught: list[Any] = []

    def keep(module: Any, args: Any, output: Any) -> None:
        if output.requires_grad:
            output.register_hook(lambda grad: caught.append(grad.detach().float().clone()))

    return caught, model.transformer.ln_f.register_forward_hook(keep)


@pytest.mark.parametrize("precision", ["bf16", "fp16-with-GradScaler"])
def test_mixed_precision_gradients_are_unscaled_and_accumulated(tmp_path: Path, precision: str) -> None:
    """8 samples, batches of 4, gradient_accumulation_steps=2: one optimizer step of two micro-batches under
    autocast. bf16 runs on CPU as it is (accelerate's native AMP). fp16: on CPU accelerate neither autocasts
    nor scales (it does on a GPU), so the test gives the Trainer's Accelerator what it makes on a GPU, a real
    torch.amp.GradScaler (here on CPU) and native AMP; the Trainer's own code then scales each micro-batch's
    loss, unscales and steps through it. The recorded parameter gradient is the one SGD applied; the recorded
    gradient of ln_f's output is the raw one the test's hook caught, divided by the scale the test set."""
    model, train = _model(), _data(8, seed=7)
    before = model.transformer.h[0].mlp.c_fc.weight.detach().clone()
    caught, handle = _ln_f_gradients(model)
    dtypes: list[Any] = []
    dtype_handle = model.transformer.h[0].mlp.c_fc.register_forward_hook(lambda m, a, output: dtypes.append(output.dtype))
    callback = ComgraCallback(tmp_path / "store", "hf", "t", DecisionMakerForRecordingsHardcoded({0}),
                              flush_seconds=0.05)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_train_epochs=1, learning_rate=0.1,
        optim="sgd", lr_scheduler_type="constant", use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True,
        seed=0, gradient_accumulation_steps=2, max_grad_norm=0.0, bf16=precision == "bf16",
        fp16=precision != "bf16")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=train, callbacks=[callback])
    scale = 1.0
    if precision != "bf16":
        assert trainer.accelerator.scaler is None  # accelerate on CPU: no scaler of its own
        trainer.accelerator.native_amp, scale = True, SCALE
        trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=SCALE, growth_interval=1000)
    trainer.train()
    handle.remove()
    dtype_handle.remove()
    assert trainer.state.global_step == 1 and len(caught) == 2
    assert dtypes == [torch.bfloat16 if precision == "bf16" else torch.float16] * 2  # autocast ran
    if precision != "bf16":
        assert trainer.accelerator.scaler.get_scale() == SCALE  # no inf: the step was taken at this scale
    applied = (before - model.transformer.h[0].mlp.c_fc.weight.detach()) / 0.1
    store = tmp_path / "store"
    (row,) = _rows(store, 0, node=PARAMETER, kind="gradients")
    assert torch.allclose(torch.tensor(row["neurons"]), applied.flatten()[:len(row["neurons"])], rtol=1e-3, atol=1e-6)
    _assert_statistics(row, applied)
    for iteration, raw in enumerate(caught):
        rows = {r["sample"]: r for r in _rows(store, 0, node="model.transformer.ln_f", kind="gradients")
                if r["iteration"] == iteration and r["aggregation"] == "sample"}
        assert sorted(rows) == [0, 1, 2, 3]
        for sample, recorded in rows.items():
            expected = raw[sample] / scale
            assert recorded["abs_max"] == pytest.approx(float(expected.abs().max()), rel=1e-3), (iteration, sample)
            assert recorded["mean"] == pytest.approx(float(expected.mean()), rel=1e-3, abs=1e-9), (iteration, sample)


def test_the_training_arguments_and_the_model_config_are_the_trials_hyperparameters(tmp_path: Path) -> None:
    callback = ComgraCallback(tmp_path / "store", "hf", "t", DecisionMakerForRecordingsHardcoded({0}),
                              flush_seconds=0.05)
    _train(tmp_path, _model(), _data(4, seed=1), callback)
    service = RecordingService(tmp_path / "store" / "hf")
    try:
        (run,) = service.runs().runs
    finally:
        service.close()
    values = run.hyperparameters
    assert (values["learning_rate"], values["seed"], values["per_device_train_batch_size"]) == (0.1, 0, 4)
    assert (values["optim"], values["lr_scheduler_type"]) == ("sgd", "constant")  # enums as their values
    assert (values["config.n_layer"], values["config.n_embd"], values["config.model_type"]) == (2, 8, "gpt2")
    assert run.status == "finished"

"""``ComgraCallback`` for Lightning: record a ``lightning.Trainer`` run with one argument.

    >>> from comgra.integrations.lightning import ComgraCallback
    >>> trainer = lightning.Trainer(callbacks=[ComgraCallback("runs", "my_group", "trial_1")])  # doctest: +SKIP

What is recorded, on the steps the recording policy picks (one in 10 by default): every module's output
of the LightningModule (``comgra.watch``) and its gradient per batch, the loss that is backpropagated
(node ``loss``; with ``accumulate_grad_batches=N`` that is the step's loss divided by N, as Lightning
scales it), the parameters as they were before the step, and the parameters' gradients once per
optimizer step. **The gradients are read in ``on_before_optimizer_step``: after all batches of gradient
accumulation were added up, after a mixed-precision scaler unscaled them, before gradient clipping
(``gradient_clip_val``) and before the optimizer step, so they are those of this step.** Under
``precision="16-mixed"`` the activation gradients and the loss (which ``on_before_backward`` gets scaled)
are divided by the precision plugin's ``GradScaler`` scale. (The obvious
version, all comgra calls in ``training_step``, reads the ``.grad`` left by the previous step.) Each
batch of an accumulated step is an iteration of the step; a batch smaller than the step's first (a
ragged last batch) has its tensors recorded without per-sample rows. The first batch of each
validation run (not the sanity check) is recorded as a step of type ``"evaluation"``; see
``comgra.integrations.steps`` for the step numbers. One optimizer per step: with several (manual
optimization), the first ``step()`` ends the recorded step.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning
import torch

import comgra
from comgra.integrations.steps import Guard, StepDriver, batch_size_of, callback_options, loss_of
from comgra.objects import DecisionMakerForRecordings, DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder, scalars_of  # store.hyperparameters: integrations reach it so

__all__ = ["ComgraCallback"]


class ComgraCallback(lightning.Callback):  # type: ignore[misc]
    """Records a ``lightning.Trainer`` run; see the module's docstring for what and when.

    ``comgra_root_path``, ``group``, ``trial_id`` and ``decision_maker_for_recordings`` are
    ``ComgraRecorder``'s; left out: ``<default_root_dir>/comgra``, ``"lightning"``, ``"trial"`` and
    ``DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10)``. Other keyword
    arguments go to ``ComgraRecorder`` as they are. Or pass a ``recorder`` of your own (not finalized at
    the end of ``fit``; the callback's own recorder is). ``watch``: True (every module's output), False
    (parameters only) or a dict of ``comgra.watch`` options. ``record_evaluation``: record the first batch
    of each validation run.
    """

    def __init__(self, comgra_root_path: str | Path | None = None, group: str | None = None,
                 trial_id: str | None = None, decision_maker_for_recordings: DecisionMakerForRecordings | None = None,
                 *, recorder: ComgraRecorder | None = None, watch: bool | Mapping[str, Any] = True,
                 record_evaluation: bool = True, **recorder_options: Any):
        self._recorder_arguments, self._watch_options = callback_options(
            recorder, watch, given=dict(comgra_root_path=comgra_root_path, group=group, trial_id=trial_id,
                                        decision_maker_for_recordings=decision_maker_for_recordings,
                                        **recorder_options), default_group="lightning", example="encoder.*")
        self.recorder = recorder
        self._owns_recorder = recorder is None
        self._record_evaluation = record_evaluation
        self.watch: Any = None
        self._driver: StepDriver | None = None
        self._guard = Guard("Lightning callback")

    # -- setting up and closing --------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: torch.nn.Module, stage: str) -> None:
        if self._driver is not None:
            return
        if self.recorder is None:
            root, group, trial_id, policy, options = self._recorder_arguments
            self.recorder = ComgraRecorder(
                Path(trainer.default_root_dir) / "comgra" if root is None else root, group, trial_id,
                DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10) if policy is None
                else policy, **options)
        self._driver = StepDriver(self.recorder, record_evaluation=self._record_evaluation,
                                  number_of=lambda: int(trainer.global_step))  # one numbering: Lightning's
        if not self.recorder.comgra_is_active:
            self._driver = None  # comgra is off: every hook below returns at once
            return
        hparams = getattr(pl_module, "hparams", None)  # save_hyperparameters(): the Runs view's hyperparameters
        if isinstance(hparams, Mapping) and hparams:
            self._guard.run(self.recorder.record_hyperparameters, scalars_of(hparams))
        if self._watch_options is not None:
            self.watch = comgra.watch(pl_module, recorder=self.recorder, **self._watch_options)
            self.watch.finds_loss = False  # the callback registers the loss itself, unscaled
        else:
            try:
                self.recorder.get_name_of_module(pl_module)
            except comgra.ComgraError:
                self.recorder.track_module("model", pl_module)

    def teardown(self, trainer: Any, pl_module: torch.nn.Module, stage: str) -> None:
        self.close()

    def close(self) -> None:
        """Finish what is open and take the hooks off; the callback's own recorder is finalized. Called at
        the end of ``fit``, ``validate``, ...: later runs of the same callback are not recorded."""
        if self._driver is not None:
            self._guard.run(self._driver.finish_open_step)
        self._driver = None
        if self.watch is not None:
            self.watch.remove()
        if self._owns_recorder and self.recorder is not None:
            self.recorder.finalize()

    # -- training --------------------------------------------------------------------------------
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._driver is not None:
            for optimizer in getattr(trainer, "optimizers", None) or []:  # their groups, on recorded steps
                self._guard.run(self.recorder.track_optimizer, optimizer)  # type: ignore[union-attr]
            self._guard.run(self._driver.training_batch, batch_size_of(batch))

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        if self._driver is not None and self._driver.open is not None:  # under "16-mixed" the loss comes scaled
            self._guard.run(self._driver.loss, loss, _scaler_of(trainer))

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._driver is not None:
            self._guard.run(self._driver.gradients_and_finish, _scaler_of(trainer))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._driver is not None:  # a batch that accumulated without an optimizer step ends its iteration
            self._guard.run(self._driver.end_micro_batch)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self._driver is not None:  # an optimizer step skipped at the epoch's end leaves no step open
            self._guard.run(self._driver.finish_open_step)

    # -- validation -------------------------------------------------------------------------------
    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        if self._driver is not None and not trainer.sanity_checking:
            self._guard.run(self._driver.evaluation_batch, batch_size_of(batch))

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        if self._driver is not None and self._driver.open is not None:
            self._guard.run(self._driver.loss, loss_of(outputs))
            self._guard.run(self._driver.end_evaluation_batch)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self._driver is not None:
            self._guard.run(self._driver.end_evaluation_run)


def _scaler_of(trainer: Any) -> Any:
    """The GradScaler of the Trainer's precision plugin (``precision="16-mixed"``), or None."""
    return getattr(trainer.precision_plugin, "scaler", None)

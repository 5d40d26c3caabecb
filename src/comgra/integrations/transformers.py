"""``ComgraCallback`` for the Hugging Face ``Trainer``: record a run with one argument.

    >>> from comgra.integrations.transformers import ComgraCallback
    >>> trainer = Trainer(model, args, train_dataset=data,
    ...                   callbacks=[ComgraCallback("runs", "my_group", "trial_1")])  # doctest: +SKIP

What is recorded, on the steps the recording policy picks (one in 10 by default): every module's output
(``comgra.watch``) and its gradient per micro-batch, the model's loss (node ``loss``), the parameters
as they were before the step, and the parameters' gradients once per optimizer step, after all
micro-batches of gradient accumulation were added up and before the optimizer step. **The Trainer
clips gradients (``max_grad_norm``, 1.0 by default) before its last callback before the optimizer step
(``on_pre_optimizer_step``), so the gradients are read earlier: at the end of the backward pass of the
step's last micro-batch (an autograd end-of-backward callback, queued by a hook on the loss the model
returned; the last micro-batch is the one for which the Trainer's ``accelerate`` ``GradientState``
says ``sync_gradients``), before clipping; under ``fp16`` they are still scaled then, and are divided by the
scale of accelerate's ``GradScaler`` (``AcceleratedOptimizer.scaler``), as the activation gradients are.**
Where that cannot be set up (a loss that is not the model's
output ``loss``), they are read in ``on_pre_optimizer_step``, after clipping. Activation gradients are
recorded as the backward pass made them, per micro-batch. Each micro-batch is an iteration
of the step; a micro-batch smaller than the step's first (a ragged last batch) has its tensors recorded
without per-sample rows. The first batch of each evaluation run is recorded as a step of type
``"evaluation"``. Step numbers are the Trainer's ``global_step``: training step g is the optimizer step the Trainer
runs while its ``global_step`` is g (its loss is logged at g + 1), and the evaluation run at ``global_step`` g is
comgra's step g of type ``"evaluation"`` (its ``eval_loss`` is logged at g; it sees the parameters that training
step g starts from). Every value the Trainer logs
(``loss``, ``grad_norm``, ``learning_rate``, ``eval_loss``, ...) becomes a KPI at the Trainer's
``global_step``, on every logging step.

A model the Trainer compiles (``torch_compile=True``) or that was compiled with ``model.compile()``
runs the callback's hooks inside the compiled graph, where they trace to nothing. The callback then
starts each step in ``on_step_begin``, outside the model: a step the policy records runs eagerly
(comgra's "force_eager" stance from there to the end of the step), and its hooks record as above; a
step it does not record runs the compiled model untouched (comgra's step is opened with the configured
``per_device_train_batch_size``; nothing of it is recorded). Evaluation runs are not recorded then.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from accelerate.state import GradientState  # the Trainer's: which micro-batch ends an optimizer step
from transformers import TrainerCallback

import comgra
from comgra.integrations.steps import TRAINING, Guard, StepDriver, batch_size_of, callback_options, loss_of
from comgra.objects import DecisionMakerForRecordings, DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder, scalars_of  # store.hyperparameters: integrations reach it so

__all__ = ["ComgraCallback"]

_is_compiling = torch.compiler.is_dynamo_compiling  # a constant in a traced hook


class ComgraCallback(TrainerCallback):  # type: ignore[misc]
    """Records a ``transformers.Trainer`` run; see the module's docstring for what and when.

    ``comgra_root_path``, ``group``, ``trial_id`` and ``decision_maker_for_recordings`` are
    ``ComgraRecorder``'s; left out: ``<output_dir>/comgra``, ``"trainer"``, ``"trial"`` and
    ``DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10)``. Other keyword
    arguments go to ``ComgraRecorder`` as they are (``max_num_batch_size_to_record=4``,
    ``comgra_is_active=False``, ...). Or pass a ``recorder`` of your own (it is not finalized at the end of
    training; the callback's own recorder is). ``watch``: True (every module's output), False (parameters
    only) or a dict of ``comgra.watch`` options (``{"include": "transformer.h.*", "max_depth": 3}``).
    ``record_evaluation``: record the first batch of each evaluation run.
    """

    def __init__(self, comgra_root_path: str | Path | None = None, group: str | None = None,
                 trial_id: str | None = None, decision_maker_for_recordings: DecisionMakerForRecordings | None = None,
                 *, recorder: ComgraRecorder | None = None, watch: bool | Mapping[str, Any] = True,
                 record_evaluation: bool = True, **recorder_options: Any):
        self._recorder_arguments, self._watch_options = callback_options(
            recorder, watch, given=dict(comgra_root_path=comgra_root_path, group=group, trial_id=trial_id,
                                        decision_maker_for_recordings=decision_maker_for_recordings,
                                        **recorder_options), default_group="trainer", example="transformer.h.*")
        self.recorder = recorder
        self._owns_recorder = recorder is None
        self._record_evaluation = record_evaluation
        self.watch: Any = None
        self._driver: StepDriver | None = None
        self._handles: list[Any] = []
        self._compiled = False  # the model runs compiled: see _start_compiled_step
        self._in_training_step = False
        self._end_of_backward_queued = False  # in this optimizer step
        self._scaler: Any = None  # the GradScaler of this optimizer step (fp16), or None
        self._guard = Guard("Trainer callback")
        self._state: Any = None  # the Trainer's TrainerState (its global_step numbers comgra's steps)

    # -- setting up --------------------------------------------------------------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._state = state
        if model is not None and self._driver is None:
            self._attach(args, model)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._state = state  # train() makes a new TrainerState
        if model is not None and self._driver is None:  # a Trainer made with model_init has its model only now
            self._attach(args, model)

    def _attach(self, args: Any, model: torch.nn.Module) -> None:
        if self.recorder is None:
            root, group, trial_id, policy, options = self._recorder_arguments
            self.recorder = ComgraRecorder(
                Path(args.output_dir) / "comgra" if root is None else root, group, trial_id,
                DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10) if policy is None
                else policy, **options)
        recorder = self.recorder
        self._guard.run(recorder.record_hyperparameters, trainer_hyperparameters(args, model))  # the Runs view's
        self._driver = StepDriver(recorder, record_evaluation=self._record_evaluation, number_of=self._global_step)
        if not recorder.comgra_is_active:
            return  # comgra is off: no hooks, nothing to pay
        if self._watch_options is not None:
            self.watch = comgra.watch(model, recorder=recorder, **self._watch_options)
            self.watch.finds_loss = False  # the callback registers the loss itself, unscaled
        elif _tracked_name(recorder, model) is None:
            recorder.track_module("model", model)
        self._handles = [model.register_forward_pre_hook(self._before_model, with_kwargs=True),
                         model.register_forward_hook(self._after_model)]
        self._compiled = bool(args.torch_compile) or getattr(model, "_compiled_call_impl", None) is not None

    def _start_compiled_step(self, args: Any) -> None:
        """A compiled model (see the module's docstring): a recorded step runs eagerly, its hooks start it; an
        unrecorded one starts here, outside the compiled graph, where the hooks do nothing."""
        driver, recorder = self._driver, self.recorder
        assert driver is not None and recorder is not None
        session, monitor = recorder.session, recorder._breakpoints
        recorded = session is not None and not session.broken and (
            recorder.decision_maker_for_recordings.is_record_on_this_step(driver.next_number(), TRAINING)
            or (monitor is not None and monitor.monitor.active))
        if recorded:
            recorder._eager.enter()  # start_batch keeps it, finish_batch (or on_step_end) leaves it
        else:
            driver.training_batch(args.per_device_train_batch_size)

    # -- the model's calls -----------------------------------------------------------------------
    def _before_model(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if _is_compiling():  # inside a compiled model, on a step that is not recorded: nothing to do
            return
        self._guard.run(self._model_called, module, args, kwargs)

    def _model_called(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        driver = self._driver
        assert driver is not None
        if self._in_training_step:
            if module.training and torch.is_grad_enabled():
                driver.training_batch(batch_size_of(args, kwargs))
        elif driver.open is None:
            driver.evaluation_batch(batch_size_of(args, kwargs))

    def _after_model(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if _is_compiling():
            return
        driver = self._driver
        if driver is not None and driver.open is not None:
            loss = loss_of(output)
            self._guard.run(driver.loss, loss)
            if driver.open == TRAINING and isinstance(loss, torch.Tensor) and loss.requires_grad \
                    and not self._end_of_backward_queued and driver.recorder.recording_is_active():
                self._guard.run(self._read_gradients_after_last_backward, loss)

    def _read_gradients_after_last_backward(self, loss: torch.Tensor) -> None:
        """On the step's last micro-batch: read the gradients when its backward pass ends, before clipping."""
        if not GradientState().sync_gradients:
            return
        self._end_of_backward_queued = True

        def queue(grad: torch.Tensor) -> None:
            engine = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]

            def after_other_end_of_backward_callbacks() -> None:
                # DDP queues its own end-of-backward callback (wait for the all-reduce, write the averaged
                # gradients into .grad) when the first parameter gradient is ready, after this hook on the loss
                # ran: a callback queued from a callback runs after it, so the gradients read are the all-reduced
                # ones the optimizer applies, not this rank's local ones.
                engine.queue_callback(lambda: self._guard.run(self._driver.record_gradients,  # type: ignore[union-attr]
                                                              self._scaler))

            engine.queue_callback(after_other_end_of_backward_callbacks)

        loss.register_hook(queue)

    # -- the Trainer's events ----------------------------------------------------------------------
    def on_step_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
        self._state = state
        self._in_training_step = True
        self._end_of_backward_queued = False
        # fp16: accelerate's AcceleratedOptimizer holds the GradScaler that scales each micro-batch's loss
        self._scaler = getattr(optimizer, "scaler", None)
        if self._compiled and self._driver is not None and self._handles:
            self._guard.run(self._start_compiled_step, args)
        if self.recorder is not None and optimizer is not None:  # its groups, on recorded steps
            self._guard.run(self.recorder.track_optimizer, optimizer)

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._driver is not None:
            self._guard.run(self._driver.end_micro_batch)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._driver is not None:
            self._guard.run(self._driver.gradients_and_finish, self._scaler)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._in_training_step = False
        if self._driver is not None:
            self._guard.run(self._driver.finish_open_step)
        if self.recorder is not None:
            self.recorder._eager.leave()  # a recorded step whose model was never called

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._driver is not None:
            self._guard.run(self._driver.end_evaluation_batch)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._driver is not None:
            self._guard.run(self._driver.end_evaluation_run)

    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        self.on_evaluate(args, state, control, **kwargs)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.recorder is not None and logs:
            self._guard.run(self._record_logs, logs, state.global_step)

    def _record_logs(self, logs: dict[str, Any], global_step: int) -> None:
        for key, value in logs.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "epoch":
                self.recorder.record_kpi_in_graph(key, "trainer", float(value), timepoint=global_step,  # type: ignore[union-attr]
                                                  record_even_if_recording_is_inactive=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    def close(self) -> None:
        """Finish what is open and take the hooks off; the callback's own recorder is finalized. Called at
        the end of ``train()``; evaluation after that is not recorded."""
        if self._driver is not None:
            self._guard.run(self._driver.finish_open_step)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.watch is not None:
            self.watch.remove()
        if self._owns_recorder and self.recorder is not None:
            self.recorder.finalize()


    def _global_step(self) -> int:
        return int(getattr(self._state, "global_step", 0) or 0)


def _tracked_name(recorder: ComgraRecorder, model: torch.nn.Module) -> str | None:
    try:
        return recorder.get_name_of_module(model)
    except comgra.ComgraError:
        return None


def trainer_hyperparameters(args: Any, model: Any) -> dict[str, Any]:
    """The ``TrainingArguments``' scalars (``learning_rate``, ``seed``, ...) and, under ``config.``, those of the
    model's config (``config.hidden_size``, ...): what the Runs view shows of a Trainer run."""
    values = scalars_of(args.to_dict()) if callable(getattr(args, "to_dict", None)) else {}
    to_dict = getattr(getattr(model, "config", None), "to_dict", None)
    if callable(to_dict):
        values.update(scalars_of(to_dict(), "config."))
    return values

"""A Ray Tune sweep recorded by comgra: every Tune trial records into one group, under Tune's trial id, with its
config as hyperparameters; then ``comgra scan`` and the app's Runs tab look at all of them.

    python docs/examples/ray_tune_sweep.py /tmp/comgra_tune      # then: comgra --path /tmp/comgra_tune/tune_sweep

Each trial is a small MLP on a regression task, its modules named by ``comgra.watch``. The learning rates
span a good one and one that diverges, with two seeds each: group the Runs tab by ``lr`` to see the seeds'
band, and sort by ``kpis.loss/train.best``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from ray import tune

import comgra
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder

GROUP = "tune_sweep"
STEPS = 12
SETTINGS = {"lr": tune.grid_search([0.05, 3.0]), "seed": tune.grid_search([0, 1]), "width": 16}


def trainable(config: dict[str, Any]) -> None:
    """One Tune trial: the comgra root and group come in the config, the trial id from Tune."""
    trial_id = tune.get_context().get_trial_id()
    recorder = ComgraRecorder(config["comgra_root"], GROUP, trial_id,
                              DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=4),
                              resource_seconds=None)
    recorder.record_hyperparameters({k: v for k, v in config.items() if k != "comgra_root"})
    torch.manual_seed(config["seed"])
    model = torch.nn.Sequential(torch.nn.Linear(4, config["width"]), torch.nn.Tanh(),
                                torch.nn.Linear(config["width"], 1))
    comgra.watch(model, recorder=recorder, name="mlp")
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    data = torch.Generator().manual_seed(config["seed"])
    weights = torch.randn(4, 1, generator=data)
    try:
        for step in range(STEPS):
            x = torch.randn(16, 4, generator=data)
            recorder.start_batch(step, 16)
            recorder.start_iteration()
            loss = torch.nn.functional.mse_loss(model(x), x @ weights)
            recorder.register_tensor("loss", loss, is_loss=True)
            loss.backward()
            recorder.record_current_gradients("gradients")
            optimizer.step()
            optimizer.zero_grad()
            recorder.record_kpi_in_graph("loss", "train", loss.detach(), record_even_if_recording_is_inactive=True)
            recorder.finish_iteration()
            recorder.finish_batch()
            tune.report({"loss": float(loss)})
    finally:
        recorder.finalize()


def run(root: Path) -> Path:
    """Run the sweep (a local Ray where none is running) and return the group folder."""
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space={**SETTINGS, "comgra_root": str(root)},
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(storage_path=str(root / "ray_results"), name=GROUP, verbose=0),
    )
    results = tuner.fit()
    errors = [str(r.error) for r in results if r.error is not None]
    if errors:
        raise RuntimeError(f"Tune trials failed: {errors}")
    return root / GROUP


if __name__ == "__main__":
    print(run(Path(sys.argv[1]).resolve()))

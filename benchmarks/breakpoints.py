"""Per-step cost of breakpoints, side by side in one run: 0, 1 and 10 breakpoints against none at all.

    python benchmarks/breakpoints.py [--steps 300] [--rounds 7]

A small MLP trains on CPU; the policy records only step 0, so every other step is the "not recorded"
path on which breakpoints are checked. Modes are interleaved round by round (each with its own
recorder) so that drift on a noisy machine hits them alike; figures are medians over the rounds.
No breakpoint ever holds (the run never pauses): what is measured is the cost of checking.

  * off:  comgra_is_active=False (the baseline)
  * bp0:  recording on the policy's steps, no breakpoint
  * bp1:  one breakpoint, ``abs_max > 1e9`` on a (64, 256) activation
  * bp10: ten breakpoints on five tensors (two conditions each, 1-3 reductions per tensor)
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder

TENSORS = ("x", "h1", "h2", "h3", "out")
CONDITIONS = {
    "bp0": [],
    "bp1": [("h1", "abs_max > 1e9")],
    "bp10": [(name, condition) for name in TENSORS for condition in ("abs_max > 1e9", "has_nan or mean > 1e9")],
}


def make_recorder(root: Path, mode: str) -> ComgraRecorder:
    breakpoints = [{"target": t, "condition": c} for t, c in CONDITIONS.get(mode, [])]
    return ComgraRecorder(root, "bench", mode, DecisionMakerForRecordingsHardcoded({0}),
                          comgra_is_active=mode != "off", breakpoints=breakpoints or None, flush_seconds=60.0)


def run_steps(recorder: ComgraRecorder, model: torch.nn.ModuleList, optimizer: torch.optim.Optimizer,
              first_step: int, steps: int) -> float:
    data = torch.Generator().manual_seed(first_step)
    started = time.perf_counter()
    for step in range(first_step, first_step + steps):
        x = torch.randn(64, 256, generator=data)
        recorder.start_batch(step, 64)
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        hidden = x
        for index, layer in enumerate(model):
            hidden = torch.relu(layer(hidden))
            recorder.register_tensor(TENSORS[index + 1], hidden)
        loss = hidden.pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
        optimizer.step()
    return (time.perf_counter() - started) / steps


def micro(recorder: ComgraRecorder, repeats: int = 3000) -> None:
    """The check alone, on the (64, 256) tensor of bp1: total, the reductions, and the Python around them."""
    from comgra.live.breakpoints import tensor_metrics

    monitor = recorder._breakpoints.monitor  # type: ignore[union-attr]
    tensor = torch.randn(64, 256)
    names = monitor.value_names["h1"]
    (watching,) = monitor.by_target["h1"]

    def timed(action) -> float:  # type: ignore[no-untyped-def]
        samples = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(repeats):
                action()
            samples.append((time.perf_counter() - started) / repeats)
        return statistics.median(samples) * 1e6

    def check() -> None:
        monitor.step.held.clear()
        monitor.check_tensor("h1", tensor)
    raw = timed(lambda: float(tensor.abs().max()))  # the reduction alone, as a user would write it
    total = timed(check)
    metrics = timed(lambda: tensor_metrics(tensor, names))
    unwatched = timed(lambda: monitor.check_tensor("x", tensor))
    evaluate = timed(lambda: watching.condition.evaluate({"abs_max": 1.0, "step": 1, "iteration": 0}))
    import comgra.live.breakpoints as module  # the same check with the reduction replaced by a constant
    real, module.tensor_metrics = module.tensor_metrics, lambda t, n: {"abs_max": 1.0}  # type: ignore[assignment]
    try:
        python_only = timed(check)
    finally:
        module.tensor_metrics = real
    print(f"one check of 'abs_max > 1e9' on a (64, 256) tensor: {total:.1f} us; the bare torch reduction "
          f"float(t.abs().max()) {raw:.1f} us, so comgra's Python per check {total - raw:.1f} us (computing the "
          f"metrics {metrics - raw:.1f} us, the condition {evaluate:.2f} us); the check with the reduction stubbed "
          f"out: {python_only:.1f} us; a tensor with no breakpoint: {unwatched:.2f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    modes = ("off", "bp0", "bp1", "bp10")
    with tempfile.TemporaryDirectory() as root:
        setups = {}
        for mode in modes:
            torch.manual_seed(0)
            model = torch.nn.ModuleList([torch.nn.Linear(256, 256) for _ in range(4)])
            recorder = make_recorder(Path(root), mode)
            setups[mode] = (recorder, model, torch.optim.SGD(model.parameters(), lr=1e-3))
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        for round_index in range(arguments.rounds + 1):  # round 0 warms up and is dropped
            for mode in modes:
                seconds = run_steps(*setups[mode], first_step=round_index * arguments.steps, steps=arguments.steps)
                if round_index:
                    times[mode].append(seconds)
        micro(setups["bp1"][0])
        for recorder, _, _ in setups.values():
            recorder.finalize()
    # The median, and the best round (least disturbed by other work on a shared machine).
    print(f"{'mode':6} {'median us/step':>15} {'spread':>13} {'vs off':>7} {'vs bp0':>7} "
          f"{'best us/step':>13} {'vs off':>7} {'vs bp0':>7}")
    for mode in modes:
        median, best = statistics.median(times[mode]), min(times[mode])
        spread = f"{best * 1e6:.0f}-{max(times[mode]) * 1e6:.0f}"
        print(f"{mode:6} {median * 1e6:15.1f} {spread:>13} {median / statistics.median(times['off']):7.3f} "
              f"{median / statistics.median(times['bp0']):7.3f} {best * 1e6:13.1f} {best / min(times['off']):7.3f} "
              f"{best / min(times['bp0']):7.3f}")


if __name__ == "__main__":
    main()

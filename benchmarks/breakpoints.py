"""Cost of breakpoints, side by side in one run: Python per condition per step, the reductions, and
the training time with 0, 1 and 10 breakpoints.

    python benchmarks/breakpoints.py [--steps 200] [--rounds 9]

A 4-layer 256-wide MLP trains on CPU (batch 64, one thread); the policy records only step 0, so every
other step is the "not recorded" path on which breakpoints are checked. No breakpoint ever holds
(the run never pauses): what is measured is the cost of checking.

1. Python per condition per step: what the recorder's breakpoint hooks do in one step (start_batch,
   six register_tensor, record_current_gradients, finish_iteration, finish_batch), timed with each
   target's reductions replaced by a stub that returns fixed numbers, divided by the number of
   conditions; real and stubbed alternate, and the least disturbed of 15 samples of each is kept. The
   reductions are timed on their own (the same step with the real ones, minus the
   stubbed one).
2. Training time: modes interleaved round by round (each with its own recorder, round 0 dropped),
   medians over the rounds, ratios to the same recorder with no breakpoint (bp0):
     off: comgra_is_active=False;  bp0: recording on the policy's steps, no breakpoint;
     bp1: ``abs_max > 1e9`` on one (64, 256) activation;
     bp10: ten breakpoints on five tensors (``abs_max > 1e9`` and ``has_nan or mean > 1e9`` each).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "breakpoints"))
from live_training import train_step  # noqa: E402  (the training step the live tests use)

TENSORS = ("x", "h1", "h2", "h3", "out")
CONDITIONS = {
    "bp0": [],
    "bp1": [("h1", "abs_max > 1e9")],
    "bp10": [(name, condition) for name in TENSORS for condition in ("abs_max > 1e9", "has_nan or mean > 1e9")],
}
MODES = ("off", "bp0", "bp1", "bp10")


def make_recorder(root: Path, mode: str) -> ComgraRecorder:
    breakpoints = [{"target": t, "condition": c} for t, c in CONDITIONS.get(mode, [])]
    return ComgraRecorder(root, "bench", mode, DecisionMakerForRecordingsHardcoded({0}),
                          comgra_is_active=mode != "off", breakpoints=breakpoints or None, flush_seconds=60.0)


def make_layers(seed: int = 0) -> tuple[torch.nn.ModuleList, list[tuple[str, Any]]]:
    torch.manual_seed(seed)
    model = torch.nn.ModuleList([torch.nn.Linear(256, 256) for _ in range(4)])
    return model, [(name, lambda h, layer=layer: torch.relu(layer(h))) for name, layer in zip(TENSORS[1:], model)]


def run_steps(recorder: ComgraRecorder, layers: list[tuple[str, Any]], optimizer: torch.optim.Optimizer,
              first_step: int, steps: int) -> float:
    data = torch.Generator().manual_seed(first_step)
    started = time.perf_counter()
    for step in range(first_step, first_step + steps):
        train_step(recorder, layers, optimizer, torch.randn(64, 256, generator=data), step)
    return (time.perf_counter() - started) / steps


# -- 1. the hooks alone ------------------------------------------------------------------------------
def hook_step_seconds(recorder: ComgraRecorder, tensors: dict[str, torch.Tensor], first_step: int,
                      repeats: int) -> float:
    """Seconds of the breakpoint hooks of one unrecorded step (what the recorder calls), one sample."""
    hooks = recorder._breakpoints  # type: ignore[union-attr]
    arguments = dict(index_of_batch_dimension=0, flags={}, recording_type=None, record_per_batch_index=None,
                     node_name=None, role_within_node=None)
    started = time.perf_counter()
    for step in range(first_step, first_step + repeats):
        hooks.start_batch(False, step, 64, True)
        hooks.start_iteration()
        for name, tensor in tensors.items():
            hooks.register(name, tensor, arguments)
        hooks.gradients("gradients", False)
        hooks.keep(("finish_iteration",))
        hooks.settle()
        hooks.finish_batch()
    return (time.perf_counter() - started) / repeats


def stub_reductions(recorder: ComgraRecorder) -> dict[str, Any]:
    """Replace each target's reductions by fixed numbers; returns the real ones to put back."""
    monitor = recorder._breakpoints.monitor  # type: ignore[union-attr]
    real = dict(monitor.value_plans)
    for target, plan in real.items():
        monitor.value_plans[target] = lambda tensor, fixed={name: 0.0 for name in plan.names}: dict(fixed)
    return real


def hook_costs(recorders: dict[str, ComgraRecorder], repeats: int, samples: int = 15) -> dict[str, dict[str, float]]:
    """Real and stubbed reductions alternate sample by sample; the least disturbed sample (the minimum)
    of each is kept, since on a shared machine other work only ever adds time."""
    tensors = {name: torch.randn(64, 256) for name in (*TENSORS, "loss")}
    best: dict[tuple[str, str], float] = {}
    step = 10 ** 6
    for _ in range(samples):
        for mode in ("bp1", "bp10"):
            recorder = recorders[mode]
            for variant in ("real", "stubbed"):
                real = stub_reductions(recorder) if variant == "stubbed" else None
                seconds = hook_step_seconds(recorder, tensors, step, repeats)
                if real is not None:
                    recorder._breakpoints.monitor.value_plans.update(real)  # type: ignore[union-attr]
                step += repeats
                best[mode, variant] = min(seconds, best.get((mode, variant), seconds))
    costs = {}
    for mode in ("bp1", "bp10"):
        total, python, count = best[mode, "real"], best[mode, "stubbed"], len(CONDITIONS[mode])
        costs[mode] = {"conditions": count, "total_us": total * 1e6, "python_us": python * 1e6,
                       "python_per_condition_us": python * 1e6 / count, "reductions_us": (total - python) * 1e6}
    return costs


def bare_reductions_us(repeats: int) -> float:
    """The reductions of bp10 written by hand (one aminmax and one mean per tensor, each read to the host)."""
    tensors = [torch.randn(64, 256) for _ in TENSORS]
    samples = []
    for _ in range(15):
        started = time.perf_counter()
        for _ in range(repeats):
            for tensor in tensors:
                low, high = torch.aminmax(tensor)
                torch.stack([low, high, tensor.mean()]).tolist()
        samples.append((time.perf_counter() - started) / repeats)
    return min(samples) * 1e6


# -- 2. training time --------------------------------------------------------------------------------
def training_times(root: Path, steps: int, rounds: int) -> tuple[dict[str, list[float]], dict[str, ComgraRecorder]]:
    setups = {}
    for mode in MODES:
        model, layers = make_layers()
        setups[mode] = (make_recorder(root, mode), layers, torch.optim.SGD(model.parameters(), lr=1e-3))
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_index in range(rounds + 1):  # round 0 warms up and is dropped
        for mode in MODES:
            seconds = run_steps(*setups[mode], first_step=round_index * steps, steps=steps)
            if round_index:
                times[mode].append(seconds)
    return times, {mode: setup[0] for mode, setup in setups.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=100, help="steps per sample of the hooks-only timing")
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        times, recorders = training_times(Path(root), arguments.steps, arguments.rounds)
        costs = hook_costs(recorders, arguments.repeats)
        bare = bare_reductions_us(arguments.repeats)
        for recorder in recorders.values():
            recorder.finalize()
    print("1. The breakpoint hooks of one unrecorded step (six registered (64, 256) tensors), best of 15 samples:")
    print(f"{'mode':6} {'conditions':>10} {'hooks us/step':>14} {'Python us/step':>15} {'us/condition':>13} "
          f"{'reductions us':>14}")
    for mode, cost in costs.items():
        print(f"{mode:6} {cost['conditions']:10d} {cost['total_us']:14.1f} {cost['python_us']:15.1f} "
              f"{cost['python_per_condition_us']:13.2f} {cost['reductions_us']:14.1f}")
    marginal = (costs["bp10"]["python_us"] - costs["bp1"]["python_us"]) / (costs["bp10"]["conditions"] - 1)
    print(f"   each condition beyond the first adds {marginal:.2f} us of Python per step (bp1 -> bp10)")
    print(f"   the same reductions as bp10 written by hand (aminmax + mean + one .tolist() per tensor): {bare:.1f} us")
    print("2. Training time per step (median over rounds; spread = best-worst round):")
    base, off = statistics.median(times["bp0"]), statistics.median(times["off"])
    print(f"{'mode':6} {'median us/step':>15} {'spread':>13} {'vs bp0':>7} {'vs off':>7} {'best us/step':>13} {'vs bp0':>7}")
    for mode in MODES:
        median = statistics.median(times[mode])
        spread = f"{min(times[mode]) * 1e6:.0f}-{max(times[mode]) * 1e6:.0f}"
        print(f"{mode:6} {median * 1e6:15.1f} {spread:>13} {median / base:7.3f} {median / off:7.3f} "
              f"{min(times[mode]) * 1e6:13.1f} {min(times[mode]) / min(times['bp0']):7.3f}")


if __name__ == "__main__":
    main()

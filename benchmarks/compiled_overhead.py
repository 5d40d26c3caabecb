"""comgra on a torch.compile'd model: a nanoGPT-style GPT (benchmarks/nano_gpt.py, ``register_tensor`` in its
blocks) at 2 and 12 layers, CPU, inductor.

Variants, side by side in one process, interleaved block by block (the order rotates each round, so that
drift on a shared machine hits them alike); each block is ``--steps`` training steps (forward, backward,
SGD step) of its own copy of the same model:

  * eager:       the model without torch.compile and without comgra (``comgra.my_recorder = None``);
  * compiled:    ``torch.compile(model)`` without comgra: the baseline of the ratios;
  * unrecorded:  compiled, with a recorder whose policy records no step (every ``register_tensor`` traced to
                 nothing): target <= 1.02x;
  * recording:   compiled, 1 recorded step in 10 (``DecisionMakerForRecordingsFrequencyPerType(
                 min_training_steps_difference=10)``; the recorded step runs eagerly): target <= 1.10x.

Prints per variant, on two clocks, the median over the rounds of (block time / the round's compiled block),
with the lowest and highest round beside it, and the median time per step: the wall clock, and the process's
CPU time (all its threads: torch's and comgra's writer), which other processes on a shared machine disturb
less. Also the graph breaks and compiled graphs counted by TorchDynamo after the warm-up (both must be 0).

    python benchmarks/compiled_overhead.py [--layers 2 12] [--rounds 5] [--steps 10] [--n-embd 128] [--batch 8]
                                           [--seq 64] [--threads 1]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import comgra
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType, DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nano_gpt  # noqa: E402

TARGETS = {"unrecorded": 1.02, "recording": 1.10}
VARIANTS = ("eager", "compiled", "unrecorded", "recording")


class Variant:
    """One model copy, its optimizer and (for the comgra variants) its recorder, trained block by block."""

    def __init__(self, name: str, model: torch.nn.Module, root: Path, config: nano_gpt.GPTConfig, batch: int):
        self.name, self.model, self.config, self.batch = name, model, config, batch
        self.forward = model if name == "eager" else torch.compile(model)
        self.optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        self.step = 0
        self.recorder: ComgraRecorder | None = None
        if name in ("unrecorded", "recording"):
            policy = DecisionMakerForRecordingsHardcoded(set()) if name == "unrecorded" else \
                DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10)
            self.recorder = ComgraRecorder(root, f"bench{config.n_layer}", name, policy, resource_seconds=None)
            self.recorder.track_module("gpt", model)

    def block(self, data: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
        """(wall seconds, process CPU seconds) of one block of training steps."""
        comgra.my_recorder = self.recorder
        start, start_cpu = time.perf_counter(), time.process_time()
        for ids, targets in data:
            self.train_step(ids, targets)
        return time.perf_counter() - start, time.process_time() - start_cpu

    def train_step(self, ids: torch.Tensor, targets: torch.Tensor) -> None:
        recorder = self.recorder
        if recorder is not None:
            recorder.start_batch(self.step, ids.shape[0])
            recorder.start_iteration()
        loss = self.forward(ids, targets)
        loss.backward()
        if recorder is not None:
            recorder.record_current_gradients("gradients")
        self.optimizer.step()
        self.optimizer.zero_grad()
        if recorder is not None:
            recorder.finish_iteration()
            recorder.finish_batch()
        self.step += 1


def dynamo_counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]


def run(layers: int, options: argparse.Namespace, root: Path) -> None:
    config = nano_gpt.GPTConfig(vocab_size=256, block_size=options.seq, n_layer=layers, n_head=4,
                                n_embd=options.n_embd)
    reference = nano_gpt.make_gpt(config)
    variants = [Variant(name, copy.deepcopy(reference), root, config, options.batch) for name in VARIANTS]
    data = nano_gpt.batches(config, options.batch, options.steps)
    started = time.perf_counter()
    for variant in variants:  # warm-up: two blocks each (compiles; the recording variant records its step 0)
        variant.block(data)
        variant.block(data)
    warm = dynamo_counts()
    print(f"\n{layers} layers (n_embd {options.n_embd}, batch {options.batch}, seq {options.seq}): "
          f"warm-up {time.perf_counter() - started:.0f} s")
    wall: dict[str, list[float]] = {name: [] for name in VARIANTS}
    cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for round_ in range(options.rounds):
        order = variants[round_ % len(variants):] + variants[:round_ % len(variants)]
        for variant in order:
            seconds, cpu_seconds = variant.block(data)
            wall[variant.name].append(seconds)
            cpu[variant.name].append(cpu_seconds)
    breaks, graphs = (now - then for now, then in zip(dynamo_counts(), warm))
    for variant in variants:
        if variant.recorder is not None:
            variant.recorder.finalize()
    comgra.my_recorder = None
    print(f"after warm-up: {breaks} graph breaks, {graphs} graphs compiled")
    print(f"{'variant':<11} {'wall ratio (min-max)':>24} {'ms/step':>8} {'cpu ratio (min-max)':>24} {'ms/step':>8}  target")
    for name in VARIANTS:
        cells = []
        for clock in (wall, cpu):
            ratios = [value / base for value, base in zip(clock[name], clock["compiled"])]
            cells.append(f"{statistics.median(ratios):>8.3f}x ({min(ratios):.2f}-{max(ratios):.2f})")
            cells.append(f"{statistics.median(clock[name]) / options.steps * 1e3:>8.2f}")
        target = f"<= {TARGETS[name]:.2f}x" if name in TARGETS else ""
        print(f"{name:<11} {cells[0]:>24} {cells[1]} {cells[2]:>24} {cells[3]}  {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 12])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="training steps per block (1 in 10 recorded)")
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    print(f"torch {torch.__version__}, {options.threads} thread(s), {options.rounds} rounds of {options.steps} steps")
    with tempfile.TemporaryDirectory() as folder:
        for layers in options.layers:
            run(layers, options, Path(folder))


if __name__ == "__main__":
    main()

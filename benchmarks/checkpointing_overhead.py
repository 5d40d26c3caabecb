"""Recording cost with activation checkpointing: comgra on checkpointed blocks against the same blocks without it.

One process, one model (an MLP of residual blocks that each register a hidden activation and their output), the
variants taking turns round by round (each round starting one variant later) so that drift on a noisy machine
hits them alike. Each variant runs
``--steps`` training steps per round; the median CPU time per step (of the process: comgra's writer thread
counts, and each variant's turn ends with ``recorder.flush()`` so that it is not charged to the next one; other
processes on a shared machine do not count) over the rounds is printed, with ratios:

* per checkpoint mode (``none``, ``reentrant``, ``non-reentrant``): comgra recording every step, and comgra
  active with no step recorded, against the same mode without comgra;
* the recorded step's comgra cost under checkpointing against its cost without checkpointing.

    python benchmarks/checkpointing_overhead.py [--rounds 7] [--steps 20] [--blocks 8] [--width 256]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder


class Block(torch.nn.Module):
    def __init__(self, index: int, width: int) -> None:
        super().__init__()
        self.index = index
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)
        self.recorder: ComgraRecorder | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.nn.functional.gelu(self.up(x))
        if self.recorder is not None:
            self.recorder.register_tensor(f"block{self.index}_hidden", hidden)
        out = x + self.down(hidden)
        if self.recorder is not None:
            self.recorder.register_tensor(f"block{self.index}_out", out)
        return out


def make_variant(mode: str, comgra: str, args: argparse.Namespace, folder: str) -> Callable[[int], None]:
    """One training step of a fresh model: ``comgra`` is "off" (no recorder), "idle" (a recorder that records no
    step) or "record" (every step recorded)."""
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([Block(i, args.width) for i in range(args.blocks)])
    head = torch.nn.Linear(args.width, 1)
    optimizer = torch.optim.SGD([*blocks.parameters(), *head.parameters()], lr=1e-3)
    # wants a gradient in every variant: else a reentrant checkpoint, none of whose inputs does, gives its blocks
    # no backward pass at all (comgra's registration of the input switches it on for the recorded step)
    data = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    recorder = None
    if comgra != "off":
        steps = set(range(10**6)) if comgra == "record" else set()
        recorder = ComgraRecorder(folder, "group", f"{mode}-{comgra}", DecisionMakerForRecordingsHardcoded(steps),
                                  resource_seconds=None)
        recorder.track_module("blocks", blocks)
        recorder.track_module("head", head)
        for block in blocks:
            block.recorder = recorder

    def step(number: int) -> None:
        if recorder is not None:
            recorder.start_batch(number, args.batch)
            recorder.start_iteration()
            recorder.register_tensor("x", data, is_input=True)
        x = data
        for block in blocks:
            x = block(x) if mode == "none" else checkpoint(block, x, use_reentrant=mode == "reentrant")
        loss = head(x).pow(2).mean()
        optimizer.zero_grad()
        if recorder is not None:
            recorder.register_tensor("loss", loss, is_loss=True)
        loss.backward()
        if recorder is not None:
            recorder.record_current_gradients("gradients")
        optimizer.step()
        if recorder is not None:
            recorder.finish_iteration()
            recorder.finish_batch()
    step.recorder = recorder  # type: ignore[attr-defined]
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # the unconnected-input notices of the first step
    modes, settings = ("none", "reentrant", "non-reentrant"), ("off", "idle", "record")
    times: dict[tuple[str, str], list[float]] = {(m, c): [] for m in modes for c in settings}
    with tempfile.TemporaryDirectory() as folder:
        variants = {(m, c): make_variant(m, c, args, folder) for m in modes for c in settings}
        counters = dict.fromkeys(variants, 0)
        for variant, step in variants.items():  # warm-up: first-step costs (kernel build, imports) out of the way
            for _ in range(2):
                step(counters[variant])
                counters[variant] += 1
        order = list(variants.items())
        for round_number in range(args.rounds):
            shift = round_number % len(order)  # each variant takes each place in a round in turn
            for variant, step in order[shift:] + order[:shift]:
                start = time.process_time()
                for _ in range(args.steps):
                    step(counters[variant])
                    counters[variant] += 1
                active = getattr(step, "recorder")
                if active is not None:  # its writer's work counts here, not in the next variant's time
                    active.flush()
                times[variant].append((time.process_time() - start) / args.steps)
        for step in variants.values():
            recorder: Any = getattr(step, "recorder")
            if recorder is not None:
                recorder.finalize()
    median = {variant: statistics.median(values) for variant, values in times.items()}
    print(f"{args.blocks} blocks of width {args.width}, batch {args.batch}, {args.rounds} rounds x {args.steps} steps, "
          "1 torch thread; median CPU ms per step")
    print(f"{'checkpoint':>14} {'off':>8} {'idle':>8} {'record':>8} {'idle/off':>9} {'record/off':>11}")
    for m in modes:
        off, idle, record = (median[(m, c)] * 1e3 for c in settings)
        print(f"{m:>14} {off:8.2f} {idle:8.2f} {record:8.2f} {idle / off:9.3f}x {record / off:10.3f}x")
    base = median[("none", "record")] - median[("none", "off")]
    for m in modes[1:]:
        cost = median[(m, "record")] - median[(m, "off")]
        print(f"comgra's cost of a recorded step, {m} against no checkpointing: {cost * 1e3:.2f} ms / "
              f"{base * 1e3:.2f} ms = {cost / base:.2f}x")


if __name__ == "__main__":
    main()

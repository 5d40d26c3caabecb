"""What keeping whole images costs (the Images tab; capture/summaries.py IMAGE_VALUES): a small CNN on (batch, 3, 32,
32) inputs, every step recorded, with whole images kept (now) and with only max_num_neurons_to_record values (before),
in alternating blocks in one process. Prints the recorded step's CPU and wall time and the bytes of the tensors table.

    python benchmarks/image_cost.py --steps 20 --rounds 3 --batch 32
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from comgra.capture import summaries
from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder

WHOLE = summaries.IMAGE_VALUES


def run(root: Path, trial: str, steps: int, batch: int) -> tuple[float, float]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 32 * 32, 10))
    recorder = ComgraRecorder(root, "group", trial, DecisionMakerForRecordingsHardcoded(set(range(steps))),
                              resource_seconds=None)
    recorder.track_module("net", net)
    cpu, wall = time.process_time(), time.perf_counter()
    for step in range(steps):
        recorder.start_batch(step, batch)
        recorder.start_iteration()
        images = torch.rand(batch, 3, 32, 32)
        recorder.register_tensor("images", images, is_input=True)
        loss = net(images).logsumexp(1).mean()
        recorder.register_tensor("loss", loss, is_loss=True, index_of_batch_dimension=None)
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    return (time.process_time() - cpu) / steps, (time.perf_counter() - wall) / steps


def tensor_bytes(root: Path, trial: str) -> int:
    return sum(p.stat().st_size for p in (root / "group" / "tensors").rglob("*.parquet") if f"trial={trial}" in str(p))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}; batch {args.batch} of 3x32x32, every step recorded")
    root = Path(tempfile.mkdtemp(prefix="comgra-image-cost-"))
    results: dict[str, list[tuple[float, float, int]]] = {"whole": [], "first": []}
    try:
        for round_ in range(args.rounds):
            for side in ("first", "whole") if round_ % 2 else ("whole", "first"):
                summaries.IMAGE_VALUES = WHOLE if side == "whole" else 0
                trial = f"{side}-{round_}"
                cpu, wall = run(root, trial, args.steps, args.batch)
                results[side].append((cpu, wall, tensor_bytes(root, trial) // args.steps))
    finally:
        summaries.IMAGE_VALUES = WHOLE
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    for side, label in (("first", "first 256 values a sample (before)"), ("whole", "whole images (now)")):
        cpu = sorted(r[0] for r in results[side])[len(results[side]) // 2]
        wall = sorted(r[1] for r in results[side])[len(results[side]) // 2]
        size = sorted(r[2] for r in results[side])[len(results[side]) // 2]
        print(f"{label:36s} recorded step: CPU {cpu * 1000:7.2f} ms, wall {wall * 1000:7.2f} ms, "
              f"tensors table {size / 1024:8.1f} KiB per step (medians of {args.rounds})")


if __name__ == "__main__":
    main()

"""A small training run for the live tests, in its own process (plain, or one rank under torchrun).

    python train_script.py ROOT OUT STEPS [--go FILE] [--breakpoint TARGET CONDITION]

Writes OUT/losses-rNNN.json (the loss of every step, as the script computed it) and
OUT/input-abs-max-rNNN.json (max |x| of every step's input) when training ends,
and OUT/progress-rNNN.txt (the last finished step) after every step. With ``--go`` it waits for that
file to exist before the first step, so that a test can set breakpoints on the running trial first.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder
from live_training import train_step  # beside this script


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("steps", type=int)
    parser.add_argument("--go")
    parser.add_argument("--breakpoint", nargs=2)
    arguments = parser.parse_args()
    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    if distributed:
        torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank() if distributed else 0
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    trained = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.05)
    breakpoints = [{"target": arguments.breakpoint[0], "condition": arguments.breakpoint[1]}] \
        if arguments.breakpoint else None
    recorder = ComgraRecorder(arguments.root, "group", "trial", DecisionMakerForRecordingsHardcoded({0}),
                              flush_seconds=60.0, breakpoints=breakpoints)
    recorder.track_module("model", model)
    out = Path(arguments.out)
    if arguments.go:
        while not Path(arguments.go).exists():
            time.sleep(0.02)
    data = torch.Generator().manual_seed(100 + rank)
    losses, input_abs_max = [], []
    for step in range(arguments.steps):
        x = torch.randn(4, 3, generator=data)
        loss, _ = train_step(recorder, [("hidden", trained)], optimizer, x, step, target=1.0)
        losses.append(loss.item())
        input_abs_max.append(x.abs().max().item())
        (out / f"progress-r{rank:03d}.txt").write_text(str(step))
    recorder.finalize()
    (out / f"losses-r{rank:03d}.json").write_text(json.dumps(losses))
    (out / f"input-abs-max-r{rank:03d}.json").write_text(json.dumps(input_abs_max))
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

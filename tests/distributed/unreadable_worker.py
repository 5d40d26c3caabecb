"""One rank of a 2-rank run that comgra must not stop; launched by test_unreadable_distributed.py through torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node=2 unreadable_worker.py MODE ROOT OUT

MODE "ddp-unused": DDP with find_unused_parameters=True (the Hugging Face Trainer's default) and a registered
output the loss does not use. MODE "fsdp2": FSDP2's fully_shard with default settings, so that the parameters
and their gradients are DTensors. Each rank trains the same model twice from the same start, with comgra and
without, and writes to OUT/result-rNNN.json the losses of both runs and whether the final parameters agree.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder

RECORDED_STEPS = {0, 2}
STEPS = 4


class TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.used, self.unused = torch.nn.Linear(3, 5), torch.nn.Linear(5, 1), torch.nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.tanh(self.body(x))
        return self.used(hidden), self.unused(hidden)


def wrapped(mode: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The model as written and as it is trained."""
    torch.manual_seed(0)  # the same initial weights on every rank and in both runs
    if mode == "ddp-unused":
        model = TwoHeads()
        return model, torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    from torch.distributed.fsdp import fully_shard
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    fully_shard(model)
    return model, model


def train(mode: str, recorder: ComgraRecorder | None, rank: int) -> tuple[list[float], list[torch.Tensor]]:
    model, trained = wrapped(mode)
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.1)
    if recorder is not None:
        recorder.track_module("model", model)
    data = torch.Generator().manual_seed(100 + rank)
    losses = []
    for step in range(STEPS):
        x = torch.randn(4, 3, generator=data)
        if recorder is not None:
            recorder.start_batch(step, 4)
            recorder.start_iteration()
            recorder.register_tensor("x", x, is_input=True)
        if mode == "ddp-unused":
            used, unused = trained(x)
        else:
            output = trained(x)
            used, unused = output[:, :1], output[:, 1:]
        loss = (used ** 2).mean()
        if recorder is not None:
            recorder.register_tensor("used", used)
            recorder.register_tensor("unused", unused)  # the loss does not use it: no gradient reaches it
            recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        if recorder is not None:
            recorder.record_current_gradients("gradients")
            recorder.finish_iteration()
            recorder.finish_batch()
        optimizer.step()
        losses.append(loss.item())
    return losses, [_full(p) for p in model.parameters()]


def _full(parameter: Any) -> torch.Tensor:
    return (parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter).detach().clone()


def main(mode: str, root: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    recorder = ComgraRecorder(root, "group", "trial", DecisionMakerForRecordingsHardcoded(RECORDED_STEPS),
                              flush_seconds=60.0, resource_seconds=None)
    with_comgra, parameters_with = train(mode, recorder, rank)
    recorder.finalize()
    without, parameters_without = train(mode, None, rank)
    same = all(torch.equal(a, b) for a, b in zip(parameters_with, parameters_without))
    Path(out, f"result-r{rank:03d}.json").write_text(json.dumps(
        {"with_comgra": with_comgra, "without": without, "same_parameters": same}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
    # Everything is written and the process group is gone. The interpreter's own teardown after FSDP2 on gloo
    # aborts now and then ("terminate called without an active exception", one CI run in four, after both
    # results were written); leave as comgra's CLI does (cli/app.run). Not comgra's: benchmarks/fsdp_overhead.py
    # --worker none, which never imports comgra, aborted the same way (torch's gloo teardown; cf.
    # pytorch/pytorch#190489).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

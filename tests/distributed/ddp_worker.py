"""One rank of a small DDP run that records with comgra; launched by test_torchrun.py through torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node=2 ddp_worker.py ROOT OUT RECORD_RANKS

Each rank trains on its own data and writes, to OUT/expected-rNNN.json, the statistics it computed
itself at registration, so that the test can check the recording rank by rank.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder

RECORDED_STEPS = {0, 2, 4}
STEPS = 6


def statistics(tensor: torch.Tensor) -> dict[str, float]:
    values = tensor.detach().double()
    return {"mean": values.mean().item(), "min": values.min().item(), "max": values.max().item()}


def main(root: str, out: str, record_ranks: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP requires
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    recorder = ComgraRecorder(root, "group", "trial", DecisionMakerForRecordingsHardcoded(RECORDED_STEPS),
                              record_ranks=record_ranks, flush_seconds=60.0)
    recorder.track_module("model", model)
    data = torch.Generator().manual_seed(100 + rank)  # each rank gets different data
    expected: dict[int, dict[str, dict[str, float]]] = {}
    for step in range(STEPS):
        x = torch.randn(4, 3, generator=data) * (1 + rank)
        recorder.start_batch(step, 4)
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        prediction = ddp(x)
        hidden = prediction * 2 + 1  # a computed tensor without a batch dimension: statistics over all of it
        recorder.register_tensor("hidden", hidden, index_of_batch_dimension=None)
        loss = (hidden ** 2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()  # DDP averages the parameter gradients across ranks here
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
        if step in RECORDED_STEPS:
            expected[step] = {"hidden": statistics(hidden), "loss": statistics(loss),
                              "weight_gradient": statistics(model[0].weight.grad)}
        optimizer.step()
    recorder.finalize()
    Path(out, f"expected-r{rank:03d}.json").write_text(json.dumps(expected))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])

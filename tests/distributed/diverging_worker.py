"""One rank of a small DDP run whose replicas may diverge; launched by test_rank_agreement.py through torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node=2 diverging_worker.py ROOT TRIAL OUT BUGGY

With BUGGY=1, rank 1 changes one parameter in place before training step 3 (outside the DDP module, which
never synchronises parameters again after wrapping: the bug of a rank-dependent edit, e.g. a weight loaded or
re-initialised on one rank only). Each rank writes the parameters it ends with to OUT/params-rNNN.pt.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder

RECORDED_STEPS = {0, 2, 4, 6}
STEPS = 8


def main(root: str, trial: str, out: str, buggy: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP requires
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    recorder = ComgraRecorder(root, "group", trial, DecisionMakerForRecordingsHardcoded(RECORDED_STEPS))
    recorder.track_module("model", model)
    recorder.track_optimizer(optimizer)
    data = torch.Generator().manual_seed(100 + rank)  # each rank gets different data
    for step in range(STEPS):
        if buggy == "1" and step == 3 and rank == 1:
            with torch.no_grad():
                model[2].bias.add_(0.25)
        x = torch.randn(4, 3, generator=data)
        recorder.start_batch(step, 4)
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        prediction = ddp(x)
        recorder.register_tensor("prediction", prediction)
        loss = (prediction ** 2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
        optimizer.step()
    recorder.finalize()
    torch.save({name: p.detach().clone() for name, p in model.named_parameters()}, Path(out, f"params-r{rank:03d}.pt"))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # as unreadable_worker.py: leave without the interpreter's teardown of the process group


if __name__ == "__main__":
    main(*sys.argv[1:5])

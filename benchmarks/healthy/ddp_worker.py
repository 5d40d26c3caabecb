"""One rank of the corpus's DDP run (started by torchrun from ``integrations.ddp_run``): every rank records."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from healthy import models  # noqa: E402
from healthy.loop import Context, Plan, train  # noqa: E402


def main() -> None:
    root, trial, steps, every = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(models.image_model("resnet"))
    ctx = Context(root, trial, steps, every, seed=100 + rank)  # each rank its own shard of the data
    data = models.Images(torch.Generator().manual_seed(0))
    data.generator = ctx.generator
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    try:
        train(ctx, model, lambda: data.batch(16), lambda m, b: F.cross_entropy(m(b[0]), b[1]), Plan(optimizer))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

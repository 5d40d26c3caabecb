"""One rank of the torch.compile runs under torch.distributed (gloo, CPU); launched by
test_compiled_distributed.py through torchrun:

    python -m torch.distributed.run --standalone --nproc_per_node=2 distributed_compiled_worker.py ROOT OUT

Six runs one after the other, each a trial of its own, recording steps 0, 2 and 4 of 6 with the GPT of
benchmarks/nano_gpt.py (``register_tensor`` in its blocks), each rank on its own data:

  * ``ddp_plain``: ``torch.compile(DistributedDataParallel(model))`` without comgra (``comgra.my_recorder =
    None``): the graph breaks of DDP's own;
  * ``ddp_eager``: ``DistributedDataParallel(model)`` with comgra, the reference;
  * ``ddp_compiled``: ``torch.compile(DistributedDataParallel(model))`` (as the DDP documentation advises);
  * ``fsdp_plain``, ``fsdp_eager`` and ``fsdp_compiled``: the same with FSDP2 (``fully_shard`` on each block
    and the model; ``torch.compile(model)``). FSDP2 breaks the graph before each block (torch's own), so each
    block's forward is a frame of its own: its names are built on recorded steps only (nano_gpt's
    ``names_on_recorded_steps_only``, the README's advice). Parameters are not tracked here (they are
    DTensors; their statistics are another test's), the activations are.

Writes OUT/result-rNNN.json: per run, TorchDynamo's counts after each step (graphs compiled, graph breaks),
its graph-break and recompile log lines, and the loss of each step as the rank computed it.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compiled_training import CONFIG, DynamoWatch, nano_gpt, train  # noqa: E402

import comgra  # noqa: E402
from comgra.objects import DecisionMakerForRecordingsHardcoded  # noqa: E402
from comgra.recorder import ComgraRecorder  # noqa: E402

RECORDED = {0, 2, 4}
STEPS = 6
RUNS = ("ddp_plain", "ddp_eager", "ddp_compiled", "fsdp_plain", "fsdp_eager", "fsdp_compiled")


def wrapped(run: str, model: torch.nn.Module) -> Any:
    if run.startswith("ddp"):
        ddp = DistributedDataParallel(model)
        return ddp if run.endswith("eager") else torch.compile(ddp)
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:  # type: ignore[union-attr]
        fully_shard(block)
    fully_shard(model)
    return model if run.endswith("eager") else torch.compile(model)


def main(root: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results: dict[str, Any] = {}
    for run in RUNS:
        torch._dynamo.reset()
        config = dataclasses.replace(CONFIG, names_on_recorded_steps_only=run.startswith("fsdp"))
        model = nano_gpt.make_gpt(config)  # the same initial weights on every rank
        recorder = ComgraRecorder(root, "group", run, DecisionMakerForRecordingsHardcoded(RECORDED),
                                  flush_seconds=60.0, resource_seconds=None, comgra_is_active=not run.endswith("plain"))
        if run.startswith("ddp"):
            recorder.track_module("gpt", model)
        forward = wrapped(run, model)
        watch = DynamoWatch()
        counts: list[dict[str, int]] = []
        with watch.watching():
            before = watch.counts()
            losses = train(recorder, model, forward, STEPS, after_step=lambda step: counts.append(watch.counts()),
                           seed=100 + rank)
        recorder.finalize()
        comgra.my_recorder = None
        results[run] = {"before": before, "counts": counts, "losses": losses,
                        "graph_break_log": watch.graph_breaks.messages, "recompile_log": watch.recompiles.messages}
    Path(out, f"result-r{rank:03d}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])

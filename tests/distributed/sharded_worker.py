"""One rank of a 2-rank run that records DTensors; launched by test_sharded_statistics.py through torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node=2 sharded_worker.py MODE ROOT OUT

MODE "fsdp2": fully_shard on each layer and on the model, each rank its own batch (data parallel); the
parameters and their gradients are DTensors (Shard(0), uneven: 7 and 3 rows over 2 ranks).
MODE "fault": as "fsdp2", recording steps 0, 2 and 4, with faults of comgra's own on rank 1: at step 2 reading a
local shard fails (the ranks must agree to leave the step's DTensors out), at step 4 its recording stops (rank 0
must not wait for it longer than comgra's collective timeout, here 5 s).
MODE "tp": parallelize_module with ColwiseParallel and RowwiseParallel on a small MLP (outputs kept as
DTensors), the same input on every rank; registered: the hidden activation (Shard(1)), the output (Replicate),
the input split by rows (Shard(0), built with DTensor.from_local), a Partial tensor (addends x * (rank + 1)) and
the input split by columns on a 2-D mesh of 1 x 2 ranks (Replicate, Shard(1)), and the input on a sub-mesh of
one rank (left out with a warning).

Each rank trains the model twice from the same start, with comgra and without, counting every collective of
torch.distributed it makes per step, and writes OUT/result-rNNN.json: the losses of both runs, whether the
final parameters agree, the collectives per step of both runs and comgra's own count.
"""
from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from torch.utils._python_dispatch import TorchDispatchMode

from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder

RECORDED_STEPS = {0, 2}
STEPS = 5
BATCH = 4
CALLS: Counter[str] = Counter()
WAITS = ("wait_tensor", "_wrap_tensor_autograd")  # bookkeeping of functional collectives, not collectives


class CountCollectives(TorchDispatchMode):
    """Every collective that reaches torch's dispatcher adds to CALLS: those of torch.distributed's API
    (FSDP2's all-gathers and reduce-scatters, comgra's all-reduces) and the functional ones (DTensor's
    redistributions, full_tensor())."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace in ("c10d", "_c10d_functional") and func._opname not in WAITS:
            CALLS[func._opname] += 1
        return func(*args, **(kwargs or {}))


def plain_model(mode: str) -> torch.nn.Sequential:
    """The model before sharding; the test's unsharded reference is this one."""
    torch.manual_seed(0)
    if mode == "tp":
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 5))
    return torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def model_of(mode: str) -> torch.nn.Module:
    model = plain_model(mode)
    if mode in ("fsdp2", "fault"):
        from torch.distributed.fsdp import fully_shard
        fully_shard(model[0])
        fully_shard(model[2])
        fully_shard(model)
    else:
        from torch.distributed.tensor import Replicate, Shard, init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        parallelize_module(model, mesh, {
            "0": ColwiseParallel(output_layouts=Shard(1), use_local_output=False),
            "2": RowwiseParallel(input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=False)})
    return model


def batch(mode: str, step: int, rank: int) -> torch.Tensor:
    """FSDP2: each rank its own samples; TP: the same samples on every rank."""
    generator = torch.Generator().manual_seed(1000 * step + (0 if mode == "tp" else rank))
    x = torch.randn(BATCH, 6, generator=generator)
    if step == 2 and mode == "tp":
        x[1, 3] = float("nan")  # a NaN in a sample that rank 0 holds of the input split by rows, an inf in rank 1's
        x[3, 0] = float("inf")
    return x


def train(mode: str, recorder: ComgraRecorder | None, rank: int) -> tuple[list[float], list[torch.Tensor], list[dict[str, int]]]:
    model = model_of(mode)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if recorder is not None:
        recorder.track_module("model", model)
    losses, calls = [], []
    for step in range(STEPS):
        STEP[0] = step
        with CountCollectives():
            losses.append(one_step(mode, model, optimizer, recorder, step, rank))
        calls.append(dict(CALLS))
        CALLS.clear()
    return losses, [_full(p) for p in model.parameters()], calls


def one_step(mode: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, recorder: ComgraRecorder | None,
             step: int, rank: int) -> float:
    x = batch(mode, step, rank)
    if recorder is not None:
        recorder.start_batch(step, BATCH)
        recorder.start_iteration()
    if mode != "tp":
        if recorder is not None:
            recorder.register_tensor("x", x, is_input=True)
        output = model(x)
        if recorder is not None:
            recorder.register_tensor("output", output)
        loss = (output ** 2).mean()
    else:
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
        clean = torch.nan_to_num(x, nan=0.0, posinf=1.0)
        hidden = model[1](model[0](clean))
        output = model[2](hidden)
        if recorder is not None:
            mesh = hidden.device_mesh
            rows = DTensor.from_local(x[rank * 2:(rank + 1) * 2], mesh, [Shard(0)])
            recorder.register_tensor("x_rows", rows, is_input=True)
            recorder.register_tensor("addends", DTensor.from_local(clean * (rank + 1), mesh, [Partial()]))
            columns = DTensor.from_local(x[:, rank * 3:(rank + 1) * 3], MESH_2D[0], [Replicate(), Shard(1)])
            recorder.register_tensor("x_columns", columns)  # a 2-D mesh (1 x 2)
            own = DTensor.from_local(x, MESH_2D[0]["replicated"], [Replicate()])  # a mesh of this rank alone
            recorder.register_tensor("x_on_a_sub_mesh", own)
            recorder.register_tensor("hidden", hidden)
            recorder.register_tensor("output", output)
        loss = (output.to_local() ** 2).mean()
    if recorder is not None:
        recorder.register_tensor("loss", loss, is_loss=True)
    optimizer.zero_grad()
    loss.backward()
    if recorder is not None:
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
    optimizer.step()
    return loss.item()


def _full(parameter: Any) -> torch.Tensor:
    return (parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter).detach().clone()


def plant_faults(rank: int) -> None:
    """Mode "fault": comgra's own faults on rank 1 (see the module's docstring)."""
    from datetime import timedelta

    from comgra.capture import session, sharded, shards
    sharded.COLLECTIVE_TIMEOUT = timedelta(seconds=5)
    if rank != 1:
        return
    read, finish = shards.local_part, session.Session.finish_iteration

    def failing_read(kind: str, registration: Any, tensor: Any, max_neurons: int) -> Any:
        if STEP[0] == 2:
            raise RuntimeError("a planted fault in reading a shard")
        return read(kind, registration, tensor, max_neurons)

    def failing_finish(self: Any) -> None:
        if STEP[0] == 4:
            raise RuntimeError("a planted fault that stops the recording")
        finish(self)
    shards.local_part = failing_read  # type: ignore[assignment]
    session.Session.finish_iteration = failing_finish  # type: ignore[method-assign]


STEP = [0]
MESH_2D: list[Any] = []  # mode "tp": a 1 x 2 device mesh, made before training (making it is collective)


def main(mode: str, root: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if mode == "fault":
        RECORDED_STEPS.add(4)
        plant_faults(rank)
    if mode == "tp":
        from torch.distributed.tensor import init_device_mesh
        MESH_2D.append(init_device_mesh("cpu", (1, 2), mesh_dim_names=("replicated", "sharded")))
    recorder = ComgraRecorder(root, "group", "trial", DecisionMakerForRecordingsHardcoded(RECORDED_STEPS),
                              flush_seconds=60.0, resource_seconds=None, max_num_neurons_to_record=5)
    with_comgra, parameters_with, calls_with = train(mode, recorder, rank)
    combiner = recorder.session.combiner  # type: ignore[union-attr]
    own = {"collectives": combiner.collectives, "bytes": combiner.bytes_moved} if combiner else None
    recorder.finalize()
    without, parameters_without, calls_without = train(mode, None, rank)
    same = all(torch.equal(a, b) for a, b in zip(parameters_with, parameters_without))
    Path(out, f"result-r{rank:03d}.json").write_text(json.dumps(
        {"with_comgra": with_comgra, "without": without, "same_parameters": same, "calls_with": calls_with,
         "calls_without": calls_without, "own": own}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
    # See unreadable_worker.py: the interpreter's teardown after FSDP2 on gloo aborts now and then, without comgra too.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

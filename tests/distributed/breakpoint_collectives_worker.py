"""One rank of a small DDP run with comgra, counting the collectives that comgra's own code calls.

    python -m torch.distributed.run --standalone --nproc_per_node=2 breakpoint_collectives_worker.py \
        ROOT OUT STEPS [--breakpoint TARGET CONDITION] [--config FILE] [--fault-rank R --fault-call N]
        [--add-breakpoint-at STEP]

Every ``torch.distributed`` collective is wrapped by a counter that notes the calls made from a
``comgra`` module (DDP's own collectives run in C++ and are not seen). With ``--fault-rank``, the
N-th collective that comgra calls on rank R raises, as a transfer fault would, on that rank only.
Writes OUT/collectives-rNNN.json ({"comgra": count, "by_function": {...}}) and OUT/losses-rNNN.json.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "breakpoints"))
from live_training import train_step  # noqa: E402

from comgra.objects import DecisionMakerForRecordingsHardcoded  # noqa: E402
from comgra.recorder import ComgraRecorder  # noqa: E402

COLLECTIVES = ("broadcast", "all_reduce", "broadcast_object_list", "all_gather", "all_gather_object", "barrier",
               "gather", "scatter", "reduce", "all_to_all", "new_group", "send", "recv", "isend", "irecv",
               "reduce_scatter", "all_gather_into_tensor", "reduce_scatter_tensor", "monitored_barrier")
calls: Counter[str] = Counter()


def _from_comgra() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("comgra"):
            return True
        if not module.startswith("torch"):
            return False
        frame = frame.f_back
    return False


def count_collectives(fault_rank: int | None, fault_call: int | None) -> None:
    for name in COLLECTIVES:
        real = getattr(dist, name, None)
        if real is None:
            continue

        @functools.wraps(real)
        def counted(*args, __real=real, __name=name, **kwargs):
            if _from_comgra():
                calls[__name] += 1
                if dist.get_rank() == fault_rank and sum(calls.values()) == fault_call:
                    raise RuntimeError("injected transfer fault in comgra's collective")
            return __real(*args, **kwargs)

        setattr(dist, name, counted)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("steps", type=int)
    parser.add_argument("--breakpoint", nargs=2)
    parser.add_argument("--config")
    parser.add_argument("--fault-rank", type=int)
    parser.add_argument("--fault-call", type=int)
    parser.add_argument("--add-breakpoint-at", type=int, help="rank 0 adds one, as the app would, at this step")
    arguments = parser.parse_args()
    count_collectives(arguments.fault_rank, arguments.fault_call)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    trained = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.05)
    breakpoints = [{"target": arguments.breakpoint[0], "condition": arguments.breakpoint[1]}] \
        if arguments.breakpoint else None
    recorder = ComgraRecorder(arguments.root, "group", "trial", DecisionMakerForRecordingsHardcoded({0}),
                              flush_seconds=60.0, breakpoints=breakpoints, config=arguments.config)
    recorder.track_module("model", model)
    data = torch.Generator().manual_seed(100 + rank)
    losses = []
    for step in range(arguments.steps):
        if step == arguments.add_breakpoint_at and rank == 0:
            from comgra.breakpoints import control
            control.add_breakpoint(Path(arguments.root) / "group" / "trials" / "trial", "loss", "step >= 0")
        x = torch.randn(4, 3, generator=data)
        loss, _ = train_step(recorder, [("hidden", trained)], optimizer, x, step, target=1.0)
        losses.append(loss.item())
    recorder.finalize()
    out = Path(arguments.out)
    (out / f"losses-r{rank:03d}.json").write_text(json.dumps(losses))
    (out / f"collectives-r{rank:03d}.json").write_text(json.dumps({"comgra": sum(calls.values()),
                                                                    "by_function": dict(calls)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

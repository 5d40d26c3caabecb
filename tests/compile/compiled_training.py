"""The training loop, the Dynamo counters and the recorded rows that the torch.compile tests share.

The model is benchmarks/nano_gpt.py's GPT (``register_tensor`` in its blocks, names built at run time),
trained with the documented loop; ``DynamoWatch`` counts what TorchDynamo did (frames converted, graphs
compiled, graph breaks) from ``torch._dynamo.utils.counters`` (``frames`` counts the frames of non-fullgraph
compiles only; ``graphs`` counts every compile) and from the ``graph_breaks`` and ``recompiles`` logs
(what ``TORCH_LOGS=graph_breaks,recompiles`` prints).
"""
from __future__ import annotations

import importlib.util
import logging
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

import comgra

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _nano_gpt() -> Any:
    module = sys.modules.get("nano_gpt")
    if module is None:
        spec = importlib.util.spec_from_file_location("nano_gpt", BENCHMARKS / "nano_gpt.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["nano_gpt"] = module
        spec.loader.exec_module(module)
    return module


nano_gpt = _nano_gpt()
CONFIG = nano_gpt.GPTConfig(vocab_size=32, block_size=8, n_layer=3, n_head=2, n_embd=16)
BATCH = 4


def train(recorder: Any, model: Any, forward: Callable[..., torch.Tensor], steps: int,
          after_step: Callable[[int], None] = lambda step: None, seed: int = 1) -> list[float]:
    """``steps`` steps of the documented loop on ``forward(ids, targets) -> loss`` (data from ``seed``); returns
    the losses. ``comgra.my_recorder`` is ``recorder`` for these steps and what it was before afterwards (a module
    fixture that trains must not leave it set for the tests after it)."""
    previous = comgra.my_recorder
    comgra.my_recorder = recorder if recorder.comgra_is_active else None  # inactive: the model without comgra
    try:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        losses = []
        for step, (ids, targets) in enumerate(nano_gpt.batches(CONFIG, BATCH, steps, seed)):
            recorder.start_batch(step, BATCH)
            recorder.start_iteration()
            loss = forward(ids, targets)
            loss.backward()
            recorder.record_current_gradients("gradients")
            optimizer.step()
            optimizer.zero_grad()
            recorder.finish_iteration()
            recorder.finish_batch()
            losses.append(loss.item())
            after_step(step)
    finally:
        comgra.my_recorder = previous
    return losses


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class DynamoWatch:
    """Snapshots of Dynamo's counters, and the graph-break and recompile log lines since ``watching()`` began."""

    def __init__(self) -> None:
        self.graph_breaks = _Collect()
        self.recompiles = _Collect()

    @staticmethod
    def counts() -> dict[str, int]:
        from torch._dynamo.utils import counters

        return {"frames": counters["frames"]["total"], "frames_ok": counters["frames"]["ok"],
                "graphs": counters["stats"]["unique_graphs"],
                "graph_breaks": sum(counters["graph_break"].values())}

    @contextmanager
    def watching(self) -> Iterator[DynamoWatch]:
        """What ``TORCH_LOGS=graph_breaks,recompiles`` would print, kept in ``graph_breaks`` and ``recompiles``."""
        torch._logging.set_logs(graph_breaks=True, recompiles=True)
        attached = [(logging.getLogger(name), handler) for name in list(logging.Logger.manager.loggerDict)
                    for suffix, handler in (("__graph_breaks", self.graph_breaks), ("__recompiles", self.recompiles))
                    if name.startswith("torch.") and name.endswith(suffix)]
        assert {handler for _, handler in attached} == {self.graph_breaks, self.recompiles}
        for logger, handler in attached:
            logger.addHandler(handler)
        try:
            yield self
        finally:
            for logger, handler in attached:
                logger.removeHandler(handler)
            torch._logging.set_logs()


STATISTICS = ("mean", "abs_mean", "std", "min", "max", "abs_max")


def rows_by_key(trial: Any, step: int, rank: int | None = None) -> dict[tuple[Any, ...], dict[str, Any]]:
    selection = trial.selection(training_step=step) if rank is None else trial.selection(training_step=step, rank=rank)
    return {(r["kind"], r["iteration"], r["tensor_name"], r["aggregation"], r["sample"], r["category"]): r
            for r in selection.to_pylist()}


def assert_rows_match(actual: dict[tuple[Any, ...], dict[str, Any]], expected: dict[tuple[Any, ...], dict[str, Any]],
                      rel: float = 1e-5) -> None:
    """Every statistic and first value within ``rel`` of the eager run's, relative to the tensor's largest
    magnitude (its largest ``abs_max`` over all rows: a mean of 1e-10 beside values of 0.01 is compared at
    the values' scale, where float32 rounding puts it)."""
    assert actual.keys() == expected.keys()
    scales: dict[tuple[Any, ...], float] = {}
    for (kind, iteration, name, *_), row in expected.items():
        if not math.isnan(row["abs_max"]):
            scales[kind, iteration, name] = max(scales.get((kind, iteration, name), 0.0), abs(row["abs_max"]))
    for key, row in expected.items():
        tolerance = rel * max(scales.get(key[:3], 1.0), 1e-12)
        for statistic in STATISTICS:
            assert abs(actual[key][statistic] - row[statistic]) <= tolerance, (key, statistic, actual[key], row)
        assert len(actual[key]["neurons"]) == len(row["neurons"])
        for got, wanted in zip(actual[key]["neurons"], row["neurons"]):
            assert abs(got - wanted) <= tolerance, (key, "neurons", got, wanted)


def graph_shape(trial: Any, step: int, rank: int | None = None) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(nodes as (id, role), edges as (source, target)) of a step's dependency graph."""
    (row,) = [r for r in trial.steps(rank=rank).to_pylist() if r["training_step"] == step]
    document = trial.graph(row["graph"])
    return ({(n["id"], n["role"]) for n in document["nodes"]},
            {(e["source"], e["target"]) for e in document["edges"]})

"""Activation checkpointing (torch.utils.checkpoint) with ``register_tensor`` inside the checkpointed function.

The recomputation in the backward pass calls ``register_tensor`` again: before, that raised "registered twice"
(``use_reentrant=True`` always, ``use_reentrant=False`` unless the registration came after the last saved tensor).
Each case here trains the same model (same seed) without checkpointing and with it, and compares every recorded
row, values and gradients, and the dependency graph: they must be the same.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.checkpoint import checkpoint, checkpoint_sequential, set_checkpoint_early_stop  # noqa: E402

from comgra.capture.session import ComgraWarning  # noqa: E402
from comgra.objects import DecisionMakerForRecordingsHardcoded  # noqa: E402
from comgra.recorder import ComgraRecorder  # noqa: E402
from comgra.store import GroupReader  # noqa: E402

BATCH, WIDTH, TOKENS, BLOCKS = 3, 8, 5, 3
STATISTICS = ("mean", "abs_mean", "std", "min", "max", "abs_max", "nan_count", "inf_count", "svd_max")


class Registering(torch.nn.Module):
    """A block that registers its input (``first``), a tensor in its middle and its output (``last``), as asked."""

    def __init__(self, index: int, where: set[str]) -> None:
        super().__init__()
        self.index, self.where = index, where
        self.recorder: ComgraRecorder | None = None

    def mark(self, place: str, name: str, tensor: torch.Tensor) -> None:
        if place in self.where:
            assert self.recorder is not None
            self.recorder.register_tensor(f"block{self.index}_{name}", tensor)


class MlpBlock(Registering):
    def __init__(self, index: int, where: set[str]) -> None:
        super().__init__(index, where)
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.up, self.down = torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.mark("first", "in", x)
        hidden = torch.nn.functional.gelu(self.up(self.norm(x)))
        self.mark("middle", "hidden", hidden)
        out = x + self.down(hidden)
        self.mark("last", "out", out)
        return out


class TransformerBlock(Registering):
    """Pre-norm self-attention and an MLP with dropout (the recomputation must draw the same mask)."""

    def __init__(self, index: int, where: set[str]) -> None:
        super().__init__(index, where)
        self.norm1, self.norm2 = torch.nn.LayerNorm(WIDTH), torch.nn.LayerNorm(WIDTH)
        self.qkv, self.proj = torch.nn.Linear(WIDTH, 3 * WIDTH), torch.nn.Linear(WIDTH, WIDTH)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.GELU(),
                                       torch.nn.Linear(2 * WIDTH, WIDTH), torch.nn.Dropout(0.2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.mark("first", "in", x)
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        attention = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(WIDTH), dim=-1)
        self.mark("middle", "attention", attention)
        x = x + self.proj(attention @ v)
        out = x + self.mlp(self.norm2(x))
        self.mark("last", "out", out)
        return out


MODELS: dict[str, tuple[type[Registering], tuple[int, ...]]] = {
    "mlp": (MlpBlock, (BATCH, WIDTH)), "transformer": (TransformerBlock, (BATCH, TOKENS, WIDTH))}


def _run_blocks(blocks: torch.nn.ModuleList, x: torch.Tensor, mode: str, outside: bool,
                recorder: ComgraRecorder) -> torch.Tensor:
    if mode.startswith("sequential"):
        return checkpoint_sequential(blocks, BLOCKS, x, use_reentrant=mode == "sequential-reentrant")
    for index, block in enumerate(blocks):
        if mode == "none":
            x = block(x)
        else:
            x = checkpoint(block, x, use_reentrant=mode == "reentrant")
        if outside:
            recorder.register_tensor(f"block{index}_output", x)
    return x


def _train(folder: Path, model_kind: str, mode: str, where: set[str], outside: bool, *,
           steps: int = 2) -> tuple[Any, list[str]]:
    """Two recorded training steps of the model; the trial's reader and the comgra warnings given."""
    block_type, shape = MODELS[model_kind]
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([block_type(i, where) for i in range(BLOCKS)])
    head = torch.nn.Linear(WIDTH, 1)
    optimizer = torch.optim.SGD([*blocks.parameters(), *head.parameters()], lr=0.1)
    data = torch.randn(steps, *shape, generator=torch.Generator().manual_seed(1))
    recorder = ComgraRecorder(folder, "group", mode, DecisionMakerForRecordingsHardcoded(set(range(steps))),
                              flush_seconds=60.0, max_num_neurons_to_record=6, resource_seconds=None)
    for block in blocks:
        block.recorder = recorder
    recorder.track_module("blocks", blocks)
    recorder.track_module("head", head)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for step in range(steps):
                recorder.start_batch(step, BATCH)
                recorder.start_iteration()
                x = data[step]
                recorder.register_tensor("x", x, is_input=True)
                y = _run_blocks(blocks, x, mode, outside, recorder)
                loss = head(y).pow(2).mean()
                recorder.register_tensor("loss", loss, is_loss=True)
                optimizer.zero_grad()
                loss.backward()
                recorder.record_current_gradients("gradients")
                optimizer.step()
                recorder.finish_iteration()
                recorder.finish_batch()
        finally:
            recorder.finalize()
    messages = [str(w.message) for w in caught if issubclass(w.category, Warning)]
    return GroupReader(folder / "group").trial(mode), messages


def _rows_by_key(trial: Any, steps: int) -> dict[tuple[Any, ...], dict[str, Any]]:
    rows = {}
    for step in range(steps):
        for row in trial.selection(training_step=step).to_pylist():
            key = (step, row["tensor_name"], row["kind"], row["iteration"], row["aggregation"], row["sample"])
            assert key not in rows, key
            rows[key] = row
    return rows


def _graph_of(trial: Any, step: int) -> dict[str, Any]:
    (row,) = [r for r in trial.steps().to_pylist() if r["training_step"] == step]
    return trial.graph(row["graph"])


def _assert_same_recording(reference: Any, checkpointed: Any, where: set[str], outside: bool, steps: int = 2) -> None:
    expected, actual = _rows_by_key(reference, steps), _rows_by_key(checkpointed, steps)
    assert sorted(actual) == sorted(expected)
    names = {(name, kind) for _, name, kind, *_ in expected}
    inner = {"first": "in", "middle": "hidden", "last": "out"}
    for place in where:  # the comparison is not vacuous: every registration inside has values and gradients
        for kind in ("forward", "gradients"):
            assert any(n.startswith("block2_") and n.endswith(("_" + inner[place], "_attention")) and k == kind
                       for n, k in names), (place, kind, sorted(names))
    if outside:
        assert ("block1_output", "gradients") in names
    for key, row in expected.items():
        other = actual[key]
        for name in STATISTICS:
            assert other[name] == pytest.approx(row[name], rel=1e-5, abs=1e-7, nan_ok=True), (key, name)
        np.testing.assert_allclose(other["neurons"], row["neurons"], rtol=1e-5, atol=1e-7, err_msg=str(key))
    for step in range(steps):
        graph, other_graph = _graph_of(reference, step), _graph_of(checkpointed, step)
        assert _edges(other_graph) == _edges(graph)
        assert other_graph["hash"] == graph["hash"]


def _edges(graph: dict[str, Any]) -> set[tuple[str, str]]:
    return {(e["source"], e["target"]) for e in graph["edges"]}


def _comgra_warnings(messages: list[str]) -> list[str]:
    return sorted(m for m in messages if "comgra" in m.lower() or "registered" in m)


PLACES = [({"first"}, False), ({"middle"}, False), ({"last"}, False), ({"middle"}, True), ({"last"}, True),
          ({"first", "middle", "last"}, True)]
MODES = ["reentrant", "non-reentrant", "sequential-reentrant", "sequential-non-reentrant"]


@pytest.mark.parametrize("model_kind", sorted(MODELS))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where,outside", PLACES, ids=lambda p: "+".join(sorted(p)) if isinstance(p, set) else
                         ("outside" if p else "inside"))
def test_checkpointed_blocks_record_what_the_uncheckpointed_model_records(tmp_path: Path, model_kind: str, mode: str,
                                                                          where: set[str], outside: bool) -> None:
    if outside and mode.startswith("sequential"):
        pytest.skip("checkpoint_sequential hands out no block output to register")
    reference, reference_warnings = _train(tmp_path / "reference", model_kind, "none", where, outside)
    checkpointed, checkpointed_warnings = _train(tmp_path / "checkpointed", model_kind, mode, where, outside)
    _assert_same_recording(reference, checkpointed, where, outside)
    assert _comgra_warnings(checkpointed_warnings) == _comgra_warnings(reference_warnings)

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
    if mode.startswith("nested"):  # the blocks checkpointed one by one, inside a checkpoint of them all
        reentrant = mode == "nested-reentrant"

        def all_blocks(x: torch.Tensor) -> torch.Tensor:
            for block in blocks:
                x = checkpoint(block, x, use_reentrant=reentrant)
            return x
        return checkpoint(all_blocks, x, use_reentrant=reentrant)
    for index, block in enumerate(blocks):
        if mode == "none":
            x = block(x)
        else:
            x = checkpoint(block, x, use_reentrant=mode == "reentrant")
        if outside:
            recorder.register_tensor(f"block{index}_output", x)
    return x


def _train(folder: Path, model_kind: str, mode: str, where: set[str], outside: bool, *, steps: int = 2,
           register_input: bool = True, iterations: int = 1, backward_after_finish: bool = False,
           watch: bool = False, backward_twice: bool = False) -> tuple[Any, list[str]]:
    """Recorded training steps of the model; the trial's reader and the ComgraWarnings given. ``iterations`` forward
    passes per step, their losses summed; ``backward_after_finish``: one backward pass after the last
    finish_iteration(); ``watch``: comgra.watch names every module's output; ``backward_twice``: two backward
    passes of the same graph (retain_graph=True), whose gradients add up."""
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
    net = torch.nn.ModuleDict({"blocks": blocks, "head": head})
    if watch:
        import comgra
        comgra.watch(net, recorder=recorder, name="net")
    else:
        recorder.track_module("blocks", blocks)
        recorder.track_module("head", head)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for step in range(steps):
                recorder.start_batch(step, BATCH)
                optimizer.zero_grad()
                total = torch.zeros(())
                for iteration in range(iterations):
                    recorder.start_iteration()
                    x = data[step] * (1 + iteration)
                    if register_input:
                        recorder.register_tensor("x", x, is_input=True)
                    y = _run_blocks(blocks, x, mode, outside, recorder)
                    loss = head(y).pow(2).mean()
                    recorder.register_tensor("loss", loss, is_loss=True)
                    total = total + loss
                    if backward_twice:
                        loss.backward(retain_graph=True)
                    if not backward_after_finish:
                        loss.backward()
                        recorder.record_current_gradients("gradients")
                    recorder.finish_iteration()
                if backward_after_finish:
                    total.backward()
                    recorder.record_current_gradients("gradients")
                optimizer.step()
                recorder.finish_batch()
        finally:
            recorder.finalize()
    messages = [str(w.message) for w in caught if issubclass(w.category, ComgraWarning)]
    return GroupReader(folder / "group").trial(mode), messages


def _rows_by_key(trial: Any, steps: int) -> dict[tuple[Any, ...], dict[str, Any]]:
    rows = {}
    for step in range(steps):
        for row in trial.selection(training_step=step).to_pylist():
            key = (step, row["tensor_name"], row["kind"], row["iteration"], row["aggregation"], row["sample"])
            assert key not in rows, key
            rows[key] = row
    return rows


def _graph_of(trial: Any, step: int, iteration: int = 0) -> dict[str, Any]:
    (row,) = [r for r in trial.steps().to_pylist() if r["training_step"] == step and r["iteration"] == iteration]
    return trial.graph(row["graph"])


def _assert_same_recording(reference: Any, checkpointed: Any, where: set[str], outside: bool, steps: int = 2,
                           graph: bool = True, iterations: int = 1) -> None:
    expected, actual = _rows_by_key(reference, steps), _rows_by_key(checkpointed, steps)
    assert sorted(actual) == sorted(expected)
    names = {(name, kind) for _, name, kind, *_ in expected}
    inner = {"first": ("_in",), "middle": ("_hidden", "_attention"), "last": ("_out",)}
    for place in where:  # the comparison is not vacuous: every registration inside has values and gradients
        for kind in ("forward", "gradients"):
            assert any(n.startswith("block2_") and n.endswith(inner[place]) and k == kind
                       for n, k in names), (place, kind, sorted(names))
    if outside:
        assert ("block1_output", "gradients") in names
    for key, row in expected.items():
        other = actual[key]
        for name in STATISTICS:
            assert other[name] == pytest.approx(row[name], rel=1e-5, abs=1e-7, nan_ok=True), (key, name)
        np.testing.assert_allclose(other["neurons"], row["neurons"], rtol=1e-5, atol=1e-7, err_msg=str(key))
    for step in range(steps if graph else 0):
        for iteration in range(iterations):
            expected_graph, other_graph = _graph_of(reference, step, iteration), _graph_of(checkpointed, step, iteration)
            assert _edges(other_graph) == _edges(expected_graph)
            assert other_graph["hash"] == expected_graph["hash"]


def _edges(graph: dict[str, Any]) -> set[tuple[str, str]]:
    return {(e["source"], e["target"]) for e in graph["edges"]}


def _comgra_warnings(messages: list[str]) -> list[str]:
    return sorted(messages)


PLACES = [({"first"}, False), ({"middle"}, False), ({"last"}, False), ({"middle"}, True), ({"last"}, True),
          ({"first", "middle", "last"}, True)]
MODES = ["reentrant", "non-reentrant", "sequential-reentrant", "sequential-non-reentrant", "nested-reentrant",
         "nested-non-reentrant"]


# checkpoint_sequential and the nested checkpoint hand out no block output to register outside
CASES = [pytest.param(where, outside, mode, model_kind,
                      id=f"{'+'.join(sorted(where))}-{'outside' if outside else 'inside'}-{mode}-{model_kind}")
         for where, outside in PLACES for mode in MODES for model_kind in sorted(MODELS)
         if not (outside and mode.startswith(("sequential", "nested")))]


@pytest.fixture(scope="module")
def uncheckpointed(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Any, list[str]]]:
    """The run without checkpointing of a (model, places, outside) case, made once for all its modes."""
    made: dict[tuple[str, str, bool], tuple[Any, list[str]]] = {}

    def get(model_kind: str, where: set[str], outside: bool) -> tuple[Any, list[str]]:
        key = (model_kind, "+".join(sorted(where)), outside)
        if key not in made:
            made[key] = _train(tmp_path_factory.mktemp("reference"), model_kind, "none", where, outside)
        return made[key]
    return get


@pytest.mark.parametrize("where,outside,mode,model_kind", CASES)
def test_checkpointed_blocks_record_what_the_uncheckpointed_model_records(
        tmp_path: Path, uncheckpointed: Callable[..., tuple[Any, list[str]]], model_kind: str, mode: str,
        where: set[str], outside: bool) -> None:
    reference, reference_warnings = uncheckpointed(model_kind, where, outside)
    checkpointed, checkpointed_warnings = _train(tmp_path / "checkpointed", model_kind, mode, where, outside)
    _assert_same_recording(reference, checkpointed, where, outside)
    assert _comgra_warnings(checkpointed_warnings) == _comgra_warnings(reference_warnings)


@pytest.mark.parametrize("mode", ["non-reentrant", "sequential-non-reentrant"])
def test_an_input_registered_only_inside_the_checkpoint_gets_its_gradient(tmp_path: Path, mode: str) -> None:
    """The data enter the first block without requires_grad; registered there (and nowhere else), comgra makes it a
    leaf that wants a gradient, as without checkpointing. (use_reentrant=True: see the next test; torch's reentrant
    checkpoint of a function none of whose inputs wants a gradient gives its parameters none either.)"""
    reference, reference_warnings = _train(tmp_path / "reference", "mlp", "none", {"first", "middle"}, False,
                                           register_input=False)
    checkpointed, checkpointed_warnings = _train(tmp_path / "checkpointed", "mlp", mode, {"first", "middle"}, False,
                                                 register_input=False)
    assert ("block0_in", "gradients") in {(n, k) for _, n, k, *_ in _rows_by_key(checkpointed, 2)}
    _assert_same_recording(reference, checkpointed, {"first", "middle"}, False)
    assert _comgra_warnings(checkpointed_warnings) == _comgra_warnings(reference_warnings)


@pytest.mark.parametrize("mode", ["none", "reentrant", "non-reentrant"])
def test_a_data_argument_registered_inside_a_reentrant_checkpoint(make_recorder: Any, open_trial: Any,
                                                                  mode: str) -> None:
    """checkpoint(f, data, state): ``data`` wants no gradient until comgra registers it inside f, under no_grad when
    use_reentrant=True; it gets the gradient of the uncheckpointed run from the recomputation's detached copy."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(WIDTH, WIDTH)
    data, state = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH, requires_grad=True)
    recorder = make_recorder({0})
    recorder.track_module("layer", layer)

    def function(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        recorder.register_tensor("data_in", x)
        out = torch.tanh(layer(x) + h)
        recorder.register_tensor("out", out)
        return out

    recorder.start_batch(0, BATCH)
    recorder.start_iteration()
    recorder.register_tensor("state", state)
    y = function(data, state) if mode == "none" else checkpoint(function, data, state,
                                                                use_reentrant=mode == "reentrant")
    loss = (y * torch.arange(WIDTH)).pow(2).mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    loss.backward()
    recorder.record_current_gradients("gradients")
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    assert not data.requires_grad  # handed back as it was
    # the gradient of data, computed here: d loss / d data = W^T (d loss / d pre-activation)
    expected_input = data.clone().requires_grad_(True)
    (torch.tanh(layer(expected_input) + state.detach()) * torch.arange(WIDTH)).pow(2).mean().backward()
    rows = {(r["tensor_name"], r["kind"], r["sample"]): r for r in open_trial().selection(training_step=0).to_pylist()}
    for sample in range(BATCH):
        np.testing.assert_allclose(rows[("data_in", "gradients", sample)]["neurons"],
                                   expected_input.grad[sample].numpy(), rtol=1e-5, atol=1e-8)
    graph = _graph_of(open_trial(), 0)
    assert {("data_in", "out"), ("state", "out"), ("layer.weight", "out"), ("out", "loss")} <= _edges(graph)


@pytest.mark.parametrize("mode", ["non-reentrant", "sequential-non-reentrant"])
def test_a_full_recomputation_without_early_stop(tmp_path: Path, mode: str) -> None:
    """set_checkpoint_early_stop(False): the recomputation runs the whole function, its last registration too."""
    where = {"first", "middle", "last"}
    reference, reference_warnings = _train(tmp_path / "reference", "transformer", "none", where, False)
    with set_checkpoint_early_stop(False):
        checkpointed, messages = _train(tmp_path / "checkpointed", "transformer", mode, where, False)
    _assert_same_recording(reference, checkpointed, where, False)
    assert _comgra_warnings(messages) == _comgra_warnings(reference_warnings)


@pytest.mark.parametrize("mode", ["reentrant", "non-reentrant"])
def test_comgra_watch_inside_checkpointed_blocks(tmp_path: Path, mode: str) -> None:
    """comgra.watch registers every module's output from forward hooks, which the recomputation runs again (and
    counts as a module's second call, name@2)."""
    reference, reference_warnings = _train(tmp_path / "reference", "mlp", "none", set(), False, watch=True)
    checkpointed, checkpointed_warnings = _train(tmp_path / "checkpointed", "mlp", mode, set(), False, watch=True)
    names = {(n, k) for _, n, k, *_ in _rows_by_key(checkpointed, 2)}
    assert {("net.blocks.1.up", "gradients"), ("net.blocks.1", "gradients")} <= names
    _assert_same_recording(reference, checkpointed, set(), False)
    assert _comgra_warnings(checkpointed_warnings) == _comgra_warnings(reference_warnings)


@pytest.mark.parametrize("mode", ["reentrant", "non-reentrant"])
def test_one_backward_pass_after_several_iterations(tmp_path: Path, mode: str) -> None:
    """Two iterations per step, one backward pass after the last finish_iteration(): the recomputations come when
    no iteration is open, each is matched to the iteration that registered its tensors. Values and gradients are
    the uncheckpointed run's; under use_reentrant=True the graphs were drawn before the recomputation made the
    function's autograd graph, which a warning says (with the fix), and they lack the edges inside."""
    where = {"first", "middle", "last"}
    options = dict(iterations=2, backward_after_finish=True)
    reference, reference_warnings = _train(tmp_path / "reference", "mlp", "none", where, True, **options)
    checkpointed, messages = _train(tmp_path / "checkpointed", "mlp", mode, where, True, **options)
    rows = _rows_by_key(checkpointed, 2)
    assert {(n, k, i) for _, n, k, i, *_ in rows} >= {("block1_hidden", "gradients", 0), ("block1_hidden", "gradients", 1)}
    _assert_same_recording(reference, checkpointed, where, True, graph=mode != "reentrant", iterations=2)
    extra = sorted(set(_comgra_warnings(messages)) - set(_comgra_warnings(reference_warnings)))
    if mode == "reentrant":  # the warning with the fix, and the tensors the graph has no edges for
        assert any("use_reentrant=True" in m and "use_reentrant=False" in m and "finish_iteration()" in m
                   for m in extra), extra
        assert all("use_reentrant" in m or "has no connection" in m for m in extra), extra
    else:
        assert extra == []


def test_a_reentrant_checkpoint_that_registers_nothing_inside_is_reported(tmp_path: Path) -> None:
    """Its forward pass makes no autograd graph and no registration leads comgra to the recomputation: what is inside
    (the blocks' parameters) has no edges. Values and gradients are still right, and a warning names the fix."""
    reference, _ = _train(tmp_path / "reference", "mlp", "none", set(), True)
    checkpointed, messages = _train(tmp_path / "checkpointed", "mlp", "reentrant", set(), True)
    _assert_same_recording(reference, checkpointed, set(), True, graph=False)
    assert _edges(_graph_of(checkpointed, 0)) < _edges(_graph_of(reference, 0))
    (warning,) = [m for m in messages if "torch.utils.checkpoint" in m]
    assert "use_reentrant=False" in warning and "register a tensor inside the function" in warning


class RegistersInBackward(torch.autograd.Function):
    """A custom op whose backward registers a tensor: not a recomputation, nothing of that name in the forward."""

    recorder: ComgraRecorder | None = None

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        assert RegistersInBackward.recorder is not None
        RegistersInBackward.recorder.register_tensor("made_in_backward", grad)
        return grad * 2


def test_a_registration_in_a_backward_pass_that_is_no_recomputation_is_reported(make_recorder: Any,
                                                                                open_trial: Any) -> None:
    recorder = make_recorder({0, 1})
    RegistersInBackward.recorder = recorder
    x = torch.randn(BATCH, WIDTH, requires_grad=True)
    with pytest.warns(ComgraWarning, match="made_in_backward") as caught:
        for step in (0, 1):
            recorder.start_batch(step, BATCH)
            recorder.start_iteration()
            recorder.register_tensor("x", x, is_input=True)
            loss = RegistersInBackward.apply(x).sum()
            recorder.register_tensor("loss", loss, is_loss=True)
            loss.backward()
            recorder.record_current_gradients("gradients")
            recorder.finish_iteration()
            recorder.finish_batch()
    recorder.finalize()
    (message,) = [str(w.message) for w in caught if "made_in_backward" in str(w.message)]  # once, not per step
    assert "backward pass" in message and "torch.utils.checkpoint" in message
    names = {r["tensor_name"] for r in open_trial().selection(training_step=1).to_pylist()}
    assert names == {"x", "loss"}


@pytest.mark.parametrize("mode", ["reentrant", "non-reentrant"])
def test_two_backward_passes_of_one_graph(tmp_path: Path, mode: str) -> None:
    """retain_graph=True: the function is recomputed once per backward pass, each time into new tensors; the
    recorded gradients are the sum of both passes, as without checkpointing, and the graph is the same."""
    where = {"first", "middle", "last"}
    reference, reference_warnings = _train(tmp_path / "reference", "mlp", "none", where, True, backward_twice=True)
    checkpointed, messages = _train(tmp_path / "checkpointed", "mlp", mode, where, True, backward_twice=True)
    _assert_same_recording(reference, checkpointed, where, True)
    assert _comgra_warnings(messages) == _comgra_warnings(reference_warnings)


class LibraryCheckpoint(torch.autograd.Function):
    """A reentrant checkpoint as DeepSpeed and FairScale write their own: the function under no_grad, and again with
    gradients in the backward pass, whose outputs are backpropagated there."""

    @staticmethod
    def forward(ctx: Any, function: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        ctx.function = function
        ctx.save_for_backward(x)
        with torch.no_grad():
            return function(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        (x,) = ctx.saved_tensors
        detached = x.detach().requires_grad_(True)
        with torch.enable_grad():
            out = ctx.function(detached)
        torch.autograd.backward(out, grad)
        return None, detached.grad


@pytest.mark.parametrize("checkpointed", [False, True])
def test_another_library_s_reentrant_checkpoint_gets_the_gradients(make_recorder: Any, open_trial: Any,
                                                                   checkpointed: bool) -> None:
    """comgra knows torch's checkpoint only; another one that recomputes in the backward pass still gives each tensor
    registered inside its gradient (from the recomputation), and a warning names what is missing (the graph)."""
    torch.manual_seed(0)
    block = MlpBlock(0, {"middle", "last"})
    x = torch.randn(BATCH, WIDTH, requires_grad=True)
    recorder = make_recorder({0})
    block.recorder = recorder
    recorder.track_module("block", block)
    seen: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recorder.start_batch(0, BATCH)
        recorder.start_iteration()
        recorder.register_tensor("x", x)
        y = LibraryCheckpoint.apply(block, x) if checkpointed else block(x)
        loss = (y * torch.arange(WIDTH)).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    # the gradients the test computes itself, without comgra and without checkpointing
    hidden = torch.nn.functional.gelu(block.up(block.norm(x.detach())))
    hidden.retain_grad()
    out = x.detach() + block.down(hidden)
    out.retain_grad()
    (out * torch.arange(WIDTH)).pow(2).mean().backward()
    seen.update(block0_hidden=hidden.grad, block0_out=out.grad)
    rows = {(r["tensor_name"], r["kind"], r["sample"]): r for r in open_trial().selection(training_step=0).to_pylist()}
    for name, grad in seen.items():
        for sample in range(BATCH):
            np.testing.assert_allclose(rows[(name, "gradients", sample)]["neurons"], grad[sample].numpy(),
                                       rtol=1e-5, atol=1e-8)
    foreign = [str(w.message) for w in caught if "LibraryCheckpointBackward" in str(w.message)]
    assert len(foreign) == (2 if checkpointed else 0), foreign
    assert all("use_reentrant=False" in m and "torch.utils.checkpoint" in m for m in foreign)

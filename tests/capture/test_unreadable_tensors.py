"""Tensors comgra cannot read never stop training: the C kernel refuses them, the recorder skips and reports them.

The kernel of capture/fused.py reads a tensor's memory through its data pointer. A DTensor, a FakeTensor, a
functional wrapper or a torch.func wrapper has no such memory (a null pointer, or one that raises): before
the kernel refused them, they killed the process with SIGSEGV. Those cases run in a child process, so that a
regression fails the test instead of killing the test run.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from comgra.capture import fused  # noqa: E402
from comgra.capture.session import ComgraWarning  # noqa: E402
from comgra.objects import DecisionMakerForRecordingsHardcoded  # noqa: E402
from comgra.recorder import ComgraRecorder  # noqa: E402
from comgra.store import GroupReader  # noqa: E402

HERE = Path(__file__).resolve()


def _child(code: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter with this checkout's comgra; a SIGSEGV there is a return code of -11."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": os.pathsep.join([str(HERE.parents[2] / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True,
                          timeout=timeout)


def _assert_survived(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, (f"the child process ended with {result.returncode}"
                                    f"{' (SIGSEGV)' if result.returncode == -11 else ''}:\n"
                                    f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


# -- a registered tensor that gets no gradient ---------------------------------------------------------------

class TwoOutputs(torch.autograd.Function):
    """One node with two outputs, as DDP's output node is: a hook on the output the loss does not use is
    called with None when the node runs."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x * 3

    @staticmethod
    def backward(ctx: Any, used: torch.Tensor, unused: torch.Tensor | None) -> torch.Tensor:
        return used * 2 + (0 if unused is None else unused * 3)


SPLITS: dict[str, Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]] = {
    "a node with two outputs": TwoOutputs.apply,
    "unbind": lambda hidden: tuple(hidden.unbind(1)[:2]),  # type: ignore[dict-item]
}


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_a_registered_tensor_without_a_gradient_leaves_the_backward_pass_alone(
        split: str, make_recorder: Any, open_trial: Any, generator: Any) -> None:
    layer = torch.nn.Linear(3, 4)
    recorder = make_recorder({0})
    recorder.track_module("net", layer)
    x = torch.randn(5, 3, generator=generator)
    recorder.start_batch(0, 5)
    recorder.start_iteration()
    recorder.register_tensor("x", x, is_input=True)
    used, unused = SPLITS[split](layer(x))
    recorder.register_tensor("used", used)
    recorder.register_tensor("unused", unused)
    used.retain_grad()
    loss = (used ** 2).mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    loss.backward()  # raised AttributeError in comgra's hook: None has no detach()
    recorder.record_current_gradients("gradients")
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    rows = open_trial().selection(training_step=0).to_pylist()
    kinds = {(r["tensor_name"], r["kind"]) for r in rows}
    assert {("used", "forward"), ("unused", "forward"), ("used", "gradients")} <= kinds
    assert ("unused", "gradients") not in kinds  # no gradient: no rows, not zeros
    (gradient,) = [r for r in rows if r["tensor_name"] == "used" and r["kind"] == "gradients" and r["sample"] == 2]
    expected = used.grad[2].double()
    assert [gradient["mean"], gradient["min"], gradient["max"]] == pytest.approx(
        [expected.mean().item(), expected.min().item(), expected.max().item()], rel=1e-5)


# -- the kernel over tensor kinds, in a child process ----------------------------------------------------------

def _dtensor(x: torch.Tensor) -> torch.Tensor:
    """A DTensor over two ranks of a fake process group (no other process: collectives are no-ops), replicated so
    that its shape is the shape of ``x``; its memory is that of a tensor inside it, not its own."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    return DTensor.from_local(x, mesh, [Replicate()], run_check=False)


def _fake(x: torch.Tensor) -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode().from_tensor(x)


class LibraryParameter(torch.nn.Parameter):
    """A Parameter subclass of a library, without __torch_dispatch__: its values are its own."""


class Tagged(torch.Tensor):
    """A tensor tagged with ``as_subclass``, without __torch_dispatch__."""


# name -> (make a tensor of the same (rows, width) from a float32 one, what the kernel may do with it):
# "read": its values; "rows": strided rows (many_row_sums reads them, read_rows wants contiguous values);
# "refuse": it must never read it.
KERNEL_KINDS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str]] = {
    "plain": (lambda x: x, "read"),
    "parameter": (lambda x: torch.nn.Parameter(x), "read"),
    "parameter subclass": (lambda x: LibraryParameter(x), "read"),
    "tagged": (lambda x: x.as_subclass(Tagged), "read"),
    "strided rows": (lambda x: torch.cat([x, x], 1)[:, : x.shape[1]], "rows"),
    "transposed": (lambda x: x.t().contiguous().t(), "refuse"),
    "negative view": (lambda x: torch._neg_view(x), "refuse"),
    "float64": (lambda x: x.double(), "refuse"),
    "bfloat16": (lambda x: x.bfloat16(), "refuse"),
    "complex": (lambda x: torch.complex(x, x), "refuse"),
    "quantized": (lambda x: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8), "refuse"),
    "sparse": (lambda x: x.to_sparse(), "refuse"),
    "meta": (lambda x: torch.empty(x.shape, device="meta"), "refuse"),
    "functional": (lambda x: torch._to_functional_tensor(x), "refuse"),  # null data pointer: SIGSEGV before
    "fake": (_fake, "refuse"),  # null data pointer: SIGSEGV before
    "dtensor": (_dtensor, "refuse"),  # FSDP2's parameters: SIGSEGV before
}
# Applied inside a torch.func transform: a wrapper whose data_ptr() raises.
TRANSFORMS = ("none", "vmap", "grad")


@settings(max_examples=120, deadline=None, database=None)
@given(kind=st.sampled_from(sorted(KERNEL_KINDS)), transform=st.sampled_from(TRANSFORMS),
       rows=st.integers(1, 4), width=st.sampled_from([1, 17, 1500]), first=st.booleans(), seed=st.integers(0, 99))
def kernel_over_tensor_kinds(kind: str, transform: str, rows: int, width: int, first: bool, seed: int) -> None:
    """Run in a child (see the test below): the kernel reads exactly the tensors it can, right, and refuses
    the others, whatever their place in the call; a plain tensor beside them is still read right."""
    make, expected = KERNEL_KINDS[kind]
    base = torch.from_numpy(np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32))
    plain = base + 1
    references = {"base": base.numpy().copy(), "plain": plain.numpy().copy()}  # outside any transform

    def check(values: torch.Tensor) -> None:
        # a transposed tensor of one row or one column has its values in order: the kernel may read it
        readable = transform == "none" and (expected != "refuse" or (kind == "transposed" and min(rows, width) == 1))
        tensors = [values, plain] if first else [plain, values]
        many = fused.many_row_sums(tensors)
        assert many is not None
        sums, skipped = many
        mine = 0 if first else 1
        assert skipped == ([] if readable else [mine]), (kind, transform, skipped)
        _assert_sums(sums[1 - mine], references["plain"])
        if readable:
            _assert_sums(sums[mine], references["base"])
        read = fused.read_rows(tensors, rows, [5, 5])
        if readable and values.is_contiguous():  # strided rows: not read here, unless one row makes them contiguous
            assert read is not None
            _assert_sums(read[0][mine], references["base"])
            kept = min(width, 5)
            np.testing.assert_array_equal(read[1][:, kept * mine: kept * (mine + 1)], references["base"][:, :5])
        else:
            assert read is None, (kind, transform)
        assert (fused.row_sums(values) is None) == (not readable)

    values = make(base)
    if transform == "none":
        check(values)
    elif kind in ("plain", "parameter", "float64", "negative view"):  # what torch.func transforms take
        stacked = torch.stack([values.detach()] * 2)

        def inside(x: torch.Tensor) -> torch.Tensor:
            check(x)
            return x.sum()
        if transform == "vmap":
            torch.func.vmap(inside)(stacked)
        else:
            torch.func.grad(inside)(values.detach().clone())


def _assert_sums(sums: np.ndarray, values: np.ndarray) -> None:
    np.testing.assert_allclose(fused.unshifted(sums, values.shape[1]), fused.reference_sums(values),
                               rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("kind", ["functional", "fake", "dtensor"])
def test_the_kernel_never_reads_a_tensor_without_memory_of_its_own(kind: str) -> None:
    """Each of these killed the process with SIGSEGV in the kernel: a null pointer, or the memory of another tensor."""
    if not fused.ensure_built():
        pytest.skip("no C compiler here: there is no kernel to feed")
    code = ("import runpy, warnings, torch\n"
            "warnings.simplefilter('ignore')\n"
            "from comgra.capture import fused\n"
            "assert fused.ensure_built()\n"
            f"make = runpy.run_path({str(HERE)!r})['KERNEL_KINDS'][{kind!r}][0]\n"
            "values = make(torch.randn(2, 3000))\n"
            "many = fused.many_row_sums([values])\n"
            "print(many[1], fused.read_rows([values], 2, [4]), fused.row_sums(values))\n")
    result = _child(code)
    _assert_survived(result)
    assert result.stdout.split() == ["[0]", "None", "None"]


def test_the_kernel_reads_only_what_it_can_over_tensor_kinds() -> None:
    if not fused.ensure_built():
        pytest.skip("no C compiler here: there is no kernel to feed")
    code = ("import runpy, sys, warnings\n"
            "warnings.simplefilter('ignore')\n"
            "from comgra.capture import fused\n"
            "assert fused.ensure_built()\n"
            f"runpy.run_path({str(HERE)!r})['kernel_over_tensor_kinds']()\n"
            "print('all kinds done')\n")
    result = _child(code)
    _assert_survived(result)
    assert "all kinds done" in result.stdout


# -- the recorder over tensor kinds: recorded right, or skipped with one warning -------------------------------

def _quantized(x: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():  # torch deprecates quantized tensors; users still have them
        warnings.simplefilter("ignore")
        return torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)


# name -> (make a tensor from a float32 (B, D) one, the values comgra must record, or None: skipped with a warning)
RECORDER_KINDS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], Any] | None]] = {
    "plain": (lambda x: x * 1, lambda x: x),
    "tagged": (lambda x: (x * 1).as_subclass(Tagged), lambda x: x),
    "float64": (lambda x: x.double(), lambda x: x.double()),
    "float16": (lambda x: x.half(), lambda x: x.half()),
    "bfloat16": (lambda x: x.bfloat16(), lambda x: x.bfloat16()),
    "int64": (lambda x: (x * 10).long(), lambda x: (x * 10).long()),
    "transposed": (lambda x: x.t().contiguous().t(), lambda x: x),
    "negative view": (lambda x: torch._neg_view(x), lambda x: -x),
    "complex": (lambda x: torch.complex(x, x), lambda x: torch.complex(x, x).abs()),  # as |z| (test_complex_tensors.py)
    "quantized": (_quantized, None),
    "sparse": (lambda x: x.to_sparse(), None),
    "meta": (lambda x: torch.empty(x.shape, device="meta"), None),
    "functional": (lambda x: torch._to_functional_tensor(x), None),
    "nested": (lambda x: torch.nested.nested_tensor(list(x.unbind(0))), None),  # .shape raised in register_tensor
    "jagged": (lambda x: torch.nested.nested_tensor(list(x.unbind(0)), layout=torch.jagged), None),
    "mkldnn": (lambda x: x.to_mkldnn(), None),
}


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@example(kind="nested", batch_dim=0, width=3, seed=0)  # raised RuntimeError out of register_tensor
@example(kind="negative view", batch_dim=0, width=20_000, seed=0)  # stopped the recording (NumPy refused it)
@example(kind="functional", batch_dim=None, width=20_000, seed=0)
@example(kind="tagged", batch_dim=0, width=20_000, seed=0)  # a subclass with its own values: recorded
@example(kind="complex", batch_dim=None, width=20_000, seed=0)  # skipped before; now as |z|
@given(kind=st.sampled_from(sorted(RECORDER_KINDS)), batch_dim=st.sampled_from([0, None]),
       width=st.sampled_from([3, 40, 20_000]), seed=st.integers(0, 99))
def test_the_recorder_records_or_skips_and_reports_every_tensor_kind(kind: str, batch_dim: int | None, width: int,
                                                                     seed: int) -> None:
    """Two recorded steps. A kind comgra can summarise is recorded as its values are (at 20,000 values per
    sample the tensor is summarised at registration, in the kernel where it can); any other gives exactly one
    warning that names the tensor and why, has no rows, and the rest of both steps is recorded."""
    make, recorded = RECORDER_KINDS[kind]
    batch = 4
    base = torch.from_numpy(np.random.default_rng(seed).standard_normal((batch, width)).astype(np.float32))
    layer = torch.nn.Linear(width, 2)
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recorder = ComgraRecorder(folder, "group", "trial", DecisionMakerForRecordingsHardcoded({0, 1}),
                                  flush_seconds=60.0, max_num_neurons_to_record=4, resource_seconds=None)
        try:
            recorder.track_module("net", layer)
            for step in (0, 1):
                recorder.start_batch(step, batch)
                recorder.start_iteration()
                recorder.register_tensor("x", base, is_input=True)
                recorder.register_tensor("odd", make(base), index_of_batch_dimension=batch_dim)
                loss = (layer(base) ** 2).mean()
                recorder.register_tensor("loss", loss, is_loss=True)
                loss.backward()
                recorder.record_current_gradients("gradients")
                recorder.finish_iteration()
                recorder.finish_batch()
        finally:
            recorder.finalize()
        trial = GroupReader(Path(folder) / "group").trial("trial")
        assert trial.steps()["training_step"].to_pylist() == [0, 1]
        for step in (0, 1):
            rows = trial.selection(training_step=step, kind="forward").to_pylist()
            assert {"x", "loss", "net.weight"} <= {r["tensor_name"] for r in rows}
            odd = [r for r in rows if r["tensor_name"] == "odd"]
            if recorded is None:
                assert odd == []
            else:
                _assert_recorded(odd, recorded(base), batch_dim)
        reports = [str(w.message) for w in caught if issubclass(w.category, ComgraWarning)
                   and "cannot summarise" in str(w.message)]
        stopped = [str(w.message) for w in caught if "stopped recording" in str(w.message)]
        assert stopped == []
        if recorded is None:
            assert len(reports) == 1 and "'odd'" in reports[0] and "because" in reports[0], reports
        else:
            assert reports == []


def _assert_recorded(rows: list[dict[str, Any]], values: torch.Tensor, batch_dim: int | None) -> None:
    wide = values.double()
    if batch_dim is None:
        (row,) = rows
        expected = [(row, wide.reshape(-1))]
    else:
        samples = {r["sample"]: r for r in rows if r["aggregation"] == "sample"}
        assert sorted(samples) == list(range(wide.shape[0]))
        expected = [(samples[i], wide[i]) for i in range(wide.shape[0])]
    for row, value in expected:
        actual = [row[k] for k in ("mean", "min", "max", "abs_max")]
        reference = [value.mean().item(), value.min().item(), value.max().item(), value.abs().max().item()]
        assert actual == pytest.approx(reference, rel=1e-5, abs=1e-6 * max(1.0, float(value.abs().max())))


# -- a compiled model (torch.compile) whose registered tensors are summarised at registration ----------------

COMPILED = '''
import json, sys, torch, comgra
from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder
from comgra.store import GroupReader
torch.manual_seed(0)
WIDTH, BATCH = 128, 512  # hidden of 65,536 values: summarised at registration, in the kernel

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, 1)
    def forward(self, x):
        hidden = torch.tanh(self.a(x))
        comgra.my_recorder.register_tensor("hidden", hidden, index_of_batch_dimension=None)
        return self.b(hidden)

net = Net()
comgra.my_recorder = recorder = ComgraRecorder(sys.argv[1], "group", "trial", DecisionMakerForRecordingsHardcoded({0, 2}),
                                               flush_seconds=60.0, resource_seconds=None)
recorder.track_module("net", net)
compiled = torch.compile(net)
expected = {}
for step in range(3):
    x = torch.randn(BATCH, WIDTH)
    recorder.start_batch(step, BATCH)
    recorder.start_iteration()
    recorder.register_tensor("x", x, is_input=True)
    loss = compiled(x).pow(2).mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    loss.backward()
    recorder.record_current_gradients("gradients")
    recorder.finish_iteration()
    recorder.finish_batch()
    with torch.no_grad():
        hidden = torch.tanh(net.a(x)).double()
    expected[step] = [hidden.mean().item(), hidden.min().item(), hidden.max().item()]
recorder.finalize()
trial = GroupReader(sys.argv[1] + "/group").trial("trial")
recorded = {}
for step in (0, 2):
    (row,) = [r for r in trial.selection(training_step=step, kind="forward").to_pylist() if r["tensor_name"] == "hidden"]
    recorded[step] = [row["mean"], row["min"], row["max"]]
from torch._dynamo.utils import counters
breaks = [reason.splitlines()[0] + " " + next((l for l in reason.splitlines() if "Skip calling" in l or "function `" in l), "")
          for reason in counters["graph_break"]]
print(json.dumps({"expected": {s: expected[s] for s in (0, 2)}, "recorded": recorded, "breaks": breaks}))
'''


@pytest.mark.slow
def test_a_compiled_model_with_large_registered_tensors_records_them(tmp_path: Path) -> None:
    """Dynamo traced into comgra at register_tensor and the kernel read a fake tensor: SIGSEGV at the first
    recorded step. A recorded step now runs the compiled model eagerly (comgra sees the real tensor), and on
    the unrecorded step comgra's call traces to nothing."""
    import json
    result = _child(COMPILED.replace("sys.argv[1]", repr(str(tmp_path))), timeout=300)
    _assert_survived(result)
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    for step in ("0", "2"):
        assert answer["recorded"][step] == pytest.approx(answer["expected"][step], rel=1e-5, abs=1e-6)
    # No graph break at all: Dynamo traced none of comgra's work (before, it broke inside comgra: "Dynamo does not
    # know how to trace the builtin `_thread.get_ident`"; then at each call, through torch.compiler.disable).
    assert answer["breaks"] == []

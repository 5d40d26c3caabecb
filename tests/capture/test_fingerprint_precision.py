"""The fingerprints' precision where their cost was cut (issue 34): a one-process run reduces a large tensor in its own
float32, a distributed run (and every small tensor) in float64; what the readers need of each, against the test's own."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from comgra.capture import evidence
from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder
from comgra.store import GroupReader


def test_a_large_parameter_is_fingerprinted_to_float32_precision_and_a_small_one_exactly(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = torch.nn.Linear(512, 256)  # a weight of 131,072 elements: above EXACT_ELEMENTS; its bias below
    assert net.weight.numel() > evidence.EXACT_ELEMENTS >= net.bias.numel()
    recorder = ComgraRecorder(tmp_path, "group", "trial", DecisionMakerForRecordingsHardcoded({0, 1}))
    recorder.track_module("net", net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    expected = []
    for step in range(2):
        values = {f"net.{n}": (float(p.detach().double().sum()), float(p.detach().double().norm()))
                  for n, p in net.named_parameters()}
        recorder.start_batch(step, 4)
        recorder.start_iteration()
        x = torch.randn(4, 512)
        recorder.register_tensor("x", x, is_input=True)
        loss = net(x).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        recorder.record_current_gradients("gradients")
        expected.append((values, {f"net.{n}": float(p.grad.double().norm()) for n, p in net.named_parameters()}))
        recorder.finish_iteration()
        recorder.finish_batch()
        optimizer.step()
    recorder.finalize()
    rows = GroupReader(tmp_path / "group").trial("trial").evidence("runinfo").to_pylist()
    found = {(r["training_step"], r["name"], r["field"]): r["number"] for r in rows if r["subject"] == "parameter"}
    for step, (values, grads) in enumerate(expected):
        for name, (total, norm) in values.items():
            tolerance = 1e-9 if name == "net.bias" else 1e-5  # float32 pairwise sums: about 1e-7 relative
            assert found[(step, name, "value_sum")] == pytest.approx(total, rel=tolerance, abs=1e-6)
            assert found[(step, name, "value_norm")] == pytest.approx(norm, rel=tolerance)
            assert found[(step, name, "grad_norm")] == pytest.approx(grads[name], rel=tolerance)
    assert not [key for key in found if key[2] == "grad_sum"]  # read by rank agreement only: not computed here
    # The frozen-parameter detector's reading: an updated weight's fingerprint moved, by far more than 1e-7.
    before, after = found[(0, "net.weight", "value_norm")], found[(1, "net.weight", "value_norm")]
    assert abs(after - before) > 1e-5 * abs(before)


def test_a_distributed_run_reduces_every_tensor_in_float64() -> None:
    torch.manual_seed(0)
    large = torch.randn(300_000) + 1e3  # a float32 sum of these loses digits that float64 keeps
    exact = evidence._fingerprints([large], exact=True)
    cheap = evidence._fingerprints([large], exact=False)
    reference = large.double()
    assert exact.dtype == cheap.dtype == torch.float64
    assert float(exact[0, 0]) == pytest.approx(float(reference.sum()), rel=1e-12)
    assert float(exact[0, 1]) == pytest.approx(float(reference.norm()), rel=1e-12)
    assert float(cheap[0, 0]) == pytest.approx(float(reference.sum()), rel=1e-5)
    assert float(cheap[0, 1]) == pytest.approx(float(reference.norm()), rel=1e-5)


@pytest.mark.parametrize("special", [None, float("nan"), float("inf"), -float("inf")])
def test_the_kernel_fingerprints_equal_torchs_float64_reductions(special: float | None) -> None:
    """The C kernel (fused.wide_sums) where every tensor is contiguous float32 on the CPU, whatever its size; torch's
    float64 reductions where one is not (a transposed view): the same numbers, to float64 rounding."""
    from comgra.capture import fused
    if not fused.ensure_built():
        pytest.skip("no C compiler here: the fingerprints take torch's path, tested above")
    torch.manual_seed(1)
    tensors = [torch.randn(300_001) + 1e3, torch.randn(7), torch.empty(0), torch.randn(33, 65) * 1e-20,
               torch.full((5,), 3e38)]  # squares beyond float32's range: float64 holds them
    if special is not None:
        tensors[1][3] = special
    assert fused.wide_sums(tensors) is not None
    assert fused.wide_sums([tensors[0], tensors[3].t()]) is None  # not contiguous: torch's path
    for found, taken in ((evidence._fingerprints(tensors, exact=True), tensors),
                         (evidence._fingerprints(tensors[1:], exact=False), tensors[1:]),  # all small: the kernel too
                         (evidence._fingerprints([tensors[0], tensors[3].t()], exact=True), [tensors[0], tensors[3].t()])):
        assert found.dtype == torch.float64
        for (total, norm), tensor in zip(found.tolist(), taken):
            wide = tensor.double()
            for value, expected in ((total, float(wide.sum())), (norm, float(wide.norm()))):
                if expected != expected:
                    assert value != value
                else:
                    assert value == pytest.approx(expected, rel=1e-12, abs=1e-300)
    sums_off = evidence._fingerprints([tensors[0], tensors[3]], exact=False, sums=False)
    assert sums_off[:, 0].tolist() == sums_off[:, 1].tolist()  # the first column repeats the norm

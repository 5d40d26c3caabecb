"""The reductions behind breakpoint conditions, against NumPy: every metric, any subset, NaN, inf, ints."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from comgra.breakpoints.conditions import VALUE_METRICS
from comgra.breakpoints.metrics import MetricPlan, tensor_metrics_of_many


def _expected(values: np.ndarray) -> dict[str, float]:
    """What each metric means, computed independently (NaN-propagating like torch)."""
    data = values.astype(np.float64).reshape(-1)
    nan = bool(np.isnan(data).any())
    with np.errstate(all="ignore"):  # inf - inf is NaN here as in torch; no warning needed
        return _reduced(data, nan)


def _reduced(data: np.ndarray, nan: bool) -> dict[str, float]:
    return {"mean": float(data.mean()), "abs_mean": float(np.abs(data).mean()),
            "std": float(data.std(ddof=1)) if data.size > 1 else 0.0,
            "min": math.nan if nan else float(data.min()), "max": math.nan if nan else float(data.max()),
            "abs_max": math.nan if nan else float(np.abs(data).max()), "norm": float(np.sqrt((data ** 2).sum())),
            "has_nan": float(nan), "has_inf": float(bool(np.isinf(data).any()))}


def _same(got: float, want: float) -> bool:
    if math.isnan(want) or math.isinf(want):
        return math.isnan(got) if math.isnan(want) else got == want
    return got == pytest.approx(want, rel=1e-9, abs=1e-9)


finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)
special = st.sampled_from([math.nan, math.inf, -math.inf, 0.0])


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(finite, finite, finite, special), min_size=1, max_size=40),
       names=st.sets(st.sampled_from(VALUE_METRICS), min_size=1))
def test_every_subset_of_metrics_matches_numpy(values: list[float], names: set[str]) -> None:
    array = np.array(values)
    got = MetricPlan(tuple(names))(torch.tensor(array, dtype=torch.float64))
    want = _expected(array)
    assert set(got) == names
    for name in names:
        if name in ("mean", "abs_mean", "std", "norm") and not np.isfinite(array).all():
            continue  # inf - inf and friends: NumPy and torch may disagree on the sign of a NaN/inf, not on its use
        assert _same(got[name], want[name]), (name, got[name], want[name])


@pytest.mark.parametrize("tensor", [torch.tensor([[1, -7], [3, 2]]), torch.tensor([True, False, True]),
                                    torch.tensor([2.5], dtype=torch.float32), torch.zeros(0)])
def test_integers_booleans_one_element_and_empty_tensors(tensor: torch.Tensor) -> None:
    got = MetricPlan(VALUE_METRICS)(tensor)
    if tensor.numel() == 0:
        assert all(math.isnan(v) for v in got.values())
        return
    want = _expected(tensor.double().numpy())
    for name in VALUE_METRICS:
        assert got[name] == pytest.approx(want[name], rel=1e-6), name


def test_has_inf_is_found_beside_a_nan() -> None:
    got = MetricPlan(("has_inf", "has_nan", "abs_max"))(torch.tensor([1.0, math.nan, -math.inf]))
    assert got["has_inf"] == 1.0 and got["has_nan"] == 1.0 and math.isnan(got["abs_max"])
    assert MetricPlan(("has_inf",))(torch.tensor([1.0, math.nan]))["has_inf"] == 0.0


def test_many_tensors_are_measured_as_one() -> None:
    parts = [torch.tensor([3.0, -4.0]), torch.tensor([[12.0]])]
    got = tensor_metrics_of_many(parts, MetricPlan(("norm", "abs_max", "mean")))
    assert got == pytest.approx({"norm": 13.0, "abs_max": 12.0, "mean": 11.0 / 3})


@pytest.mark.parametrize("count", [1, 2])
def test_complex_tensors_are_measured_by_their_magnitudes(count: int) -> None:
    """As the recording has them (tests/capture/test_complex_tensors.py): the metrics of |z|, never of the real part."""
    generator = torch.Generator().manual_seed(5)
    tensors = [torch.complex(torch.randn(3, 7, generator=generator, dtype=torch.float64),
                             torch.randn(3, 7, generator=generator, dtype=torch.float64))
               for _ in range(count)]
    magnitudes = np.concatenate([t.abs().double().numpy().reshape(-1) for t in tensors])
    got = tensor_metrics_of_many(tensors, tuple(VALUE_METRICS))
    want = _expected(magnitudes)
    assert all(_same(got[name], want[name]) for name in VALUE_METRICS), (got, want)

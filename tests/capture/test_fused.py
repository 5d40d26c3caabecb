"""The one-pass statistics kernel (capture/fused.py) against NumPy, and the eager path wherever the
kernel is not there: no compiler, a failed build, a kernel that fails its self-test, switched off."""
from __future__ import annotations

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from comgra.capture import fused, stats
from comgra.capture.stats import summarize
from numeric_checks import assert_float32_close, reference_statistics  # beside this file


FINITE = st.floats(min_value=-1e4, max_value=1e4, width=32, allow_nan=False, allow_infinity=False)


@pytest.fixture(scope="module")
def kernel() -> None:
    if not fused.ensure_built():
        pytest.skip("no C compiler here: the kernel cannot be built (the eager path is tested below)")


def reference_sums(array: np.ndarray) -> np.ndarray:
    wide = array.astype(np.float64)
    return np.stack([wide.sum(1), (wide * wide).sum(1), np.abs(wide).sum(1), wide.min(1), wide.max(1)])


@st.composite
def strided_rows(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    """(B, D) values around the kernel's lane (16) and block (1024) sizes, and extra columns that make
    the rows of the slice [:, :D] strided."""
    rows = draw(st.integers(1, 4))
    width = draw(st.sampled_from([1, 15, 16, 17, 1023, 1024, 1025, 3000])) + draw(st.integers(0, 3))
    offset = draw(st.sampled_from([0.0, 1e3, -3e3]))
    seed = draw(st.integers(0, 2**31 - 1))
    values = np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32) + np.float32(offset)
    values[:, :draw(st.integers(0, min(width, 8)))] = draw(hnp.arrays(np.float32, 1, elements=FINITE))[0]
    return values, draw(st.integers(0, 5))


@settings(max_examples=100, deadline=None)
@given(strided_rows())
def test_kernel_sums_match_numpy(kernel: None, case: tuple[np.ndarray, int]) -> None:
    values, extra = case
    wider = np.concatenate([values, np.full((values.shape[0], extra), 7.0, np.float32)], axis=1)
    tensor = torch.from_numpy(wider)[:, :values.shape[1]]
    result = fused.row_sums(tensor)
    assert result is not None and result.shape == (5, values.shape[0])
    expected = reference_sums(values)
    np.testing.assert_array_equal(result[3:], expected[3:])  # min and max are exact
    scale = np.abs(values.astype(np.float64)).sum(1)
    np.testing.assert_allclose(result[0], expected[0], rtol=0, atol=1e-6 * (scale.max() + 1))
    np.testing.assert_allclose(result[1:3], expected[1:3], rtol=5e-6)


def test_kernel_declines_what_it_cannot_read(kernel: None) -> None:
    matrix = torch.arange(12.0).reshape(3, 4)
    assert fused.row_sums(matrix.mT) is None  # columns not contiguous
    assert fused.row_sums(matrix.double()) is None
    assert fused.row_sums(matrix.reshape(-1)) is None
    assert fused.row_sums(torch.empty(3, 0)) is None


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_in_a_large_tensor_take_the_eager_path(kernel: None, special: float) -> None:
    """The kernel's comparisons skip NaN; a row whose sum of |.| is not finite gets torch's statistics."""
    array = np.random.default_rng(1).standard_normal((2, 20_000)).astype(np.float32)
    array[0, 12_345] = special
    summary = summarize([torch.from_numpy(array)], batch_size=2, max_neurons=[0])
    expected = reference_statistics(array)
    assert_float32_close(summary.per_sample[:, 0].numpy(), expected, float(np.abs(array[1]).max()))


@pytest.mark.parametrize("offset, spread", [(0.0, 1.0), (1e3, 1e-2)])
def test_statistics_with_and_without_the_kernel_agree(kernel: None, offset: float, spread: float) -> None:
    array = (offset + spread * np.random.default_rng(2).standard_normal((3, 200_000))).astype(np.float32)
    tensors = [torch.from_numpy(array)]
    with_kernel = summarize(tensors, batch_size=3, max_neurons=[4]).per_sample.numpy()
    original = stats.FUSED
    stats.FUSED = False
    try:
        eager = summarize(tensors, batch_size=3, max_neurons=[4]).per_sample.numpy()
    finally:
        stats.FUSED = original
    np.testing.assert_allclose(with_kernel, eager, rtol=2e-5, atol=1e-6 * (abs(offset) + spread))
    np.testing.assert_allclose(with_kernel[:, 0], reference_statistics(array), rtol=2e-5,
                               atol=1e-6 * (abs(offset) + spread))


def _fresh_state(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(fused, "_STATE", {"function": None, "building": False, "failed": False, "pid": 0})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _wait_for_build() -> None:
    for thread in threading.enumerate():
        if thread.name == "comgra-kernel-build":
            thread.join(60)


def test_a_failing_compiler_leaves_the_eager_path(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    _fresh_state(monkeypatch, tmp_path)
    monkeypatch.setattr(fused, "_compiler", lambda: "/bin/false")
    assert fused.row_sums(torch.ones(2, 50_000)) is None  # the build starts on a thread; eager meanwhile
    _wait_for_build()
    assert fused._STATE["failed"] and fused.row_sums(torch.ones(2, 50_000)) is None
    array = np.random.default_rng(3).standard_normal((2, 50_000)).astype(np.float32)
    per_sample = summarize([torch.from_numpy(array)], batch_size=2, max_neurons=[0]).per_sample[:, 0].numpy()
    assert_float32_close(per_sample, reference_statistics(array), float(np.abs(array).max()))


def test_no_compiler_means_no_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    _fresh_state(monkeypatch, tmp_path)
    monkeypatch.setattr(fused, "_compiler", lambda: None)
    assert not fused.ensure_built()


def test_a_kernel_that_fails_its_self_test_is_not_used(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    if fused._compiler() is None:
        pytest.skip("no C compiler")
    _fresh_state(monkeypatch, tmp_path)
    monkeypatch.setattr(fused, "SOURCE", fused.SOURCE.replace("out[0] = s;", "out[0] = s + 1;"))
    assert not fused.ensure_built()
    assert fused.row_sums(torch.ones(1, 10_000)) is None


def test_switched_off_by_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    _fresh_state(monkeypatch, tmp_path)
    monkeypatch.setenv("COMGRA_FUSED_KERNEL", "0")
    assert not fused.ensure_built()
    assert not list((tmp_path / "cache").glob("**/*.so"))


def test_a_cached_build_is_loaded_by_the_next_process(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    if fused._compiler() is None:
        pytest.skip("no C compiler")
    _fresh_state(monkeypatch, tmp_path)
    assert fused.ensure_built()
    assert len(list((tmp_path / "cache").glob("comgra/kernels/row_sums-*.so"))) == 1
    _fresh_state(monkeypatch, tmp_path)  # as a new process finds the cache
    assert fused.row_sums(torch.ones(1, 10_000)) is not None  # loaded at once, no build thread

"""The one-pass statistics kernel (capture/fused.py) against NumPy, and the eager path wherever the
kernel is not there: no compiler, a failed build, a kernel that fails its self-test, switched off."""
from __future__ import annotations

import math
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
@given(strided_rows(), strided_rows())
def test_kernel_sums_match_numpy(kernel: None, case: tuple[np.ndarray, int], other: tuple[np.ndarray, int]) -> None:
    """Two tensors in one call (as a step's parameters are), each against NumPy."""
    rows = case[0].shape[0]
    tensors, arrays = [], []
    for values, extra in (case, (other[0][:1].repeat(rows, 0), other[1])):
        wider = np.concatenate([values, np.full((rows, extra), 7.0, np.float32)], axis=1)
        tensors.append(torch.from_numpy(wider)[:, :values.shape[1]])
        arrays.append(values)
    result = fused.many_row_sums(tensors)
    assert result is not None and result[1] == [] and result[0].shape == (2, 6, rows)
    for sums, values in zip(result[0], arrays):
        _assert_sums_match(sums, values)
    np.testing.assert_array_equal(fused.row_sums(tensors[0]), result[0][0])  # one tensor alone: the same


def _assert_sums_match(sums: np.ndarray, values: np.ndarray) -> None:
    wide = values.astype(np.float64)
    shift = sums[5]
    np.testing.assert_array_equal(shift, wide[:, :16].mean(1).astype(np.float32))  # the mean of the first 16
    np.testing.assert_array_equal(sums[3:5], np.stack([wide.min(1), wide.max(1)]))  # min and max are exact
    deviation = wide - shift[:, None]
    scale = np.abs(deviation).sum(1)
    np.testing.assert_allclose(sums[0], deviation.sum(1), rtol=0, atol=1e-6 * (scale.max() + 1))
    np.testing.assert_allclose(sums[1], (deviation * deviation).sum(1), rtol=5e-6)
    np.testing.assert_allclose(sums[2], np.abs(wide).sum(1), rtol=5e-6)
    unshifted, reference = fused.unshifted(sums, values.shape[1]), fused.reference_sums(values)
    # The sums come back as s + n k and q + 2 k s + n k^2 from the shifted sums: their float32 rounding is
    # that of the shifted sums, which exceed the plain ones where the first 16 values lie far from the rest.
    rows = [0, 2, 3, 4]
    np.testing.assert_allclose(unshifted[rows], reference[rows], rtol=5e-6,
                               atol=1e-6 * (max(np.abs(wide).sum(1).max(), scale.max()) + 1))
    shifted_magnitude = (deviation * deviation).sum(1) + 2 * np.abs(shift) * scale
    np.testing.assert_allclose(unshifted[1], reference[1], rtol=5e-6, atol=5e-6 * shifted_magnitude.max())


def test_kernel_skips_what_it_cannot_read_and_reads_the_rest(kernel: None) -> None:
    good = torch.randn(2, 100)
    result = fused.many_row_sums([good.double(), good, good.mT.contiguous().mT, torch.empty(2, 0), good[:1]])
    assert result is not None
    sums, skipped = result
    assert skipped == [0, 2, 3, 4]
    assert np.isnan(sums[skipped]).all()
    _assert_sums_match(sums[1], good.numpy())


def test_a_call_shared_with_the_helper_thread_gives_the_same_sums(kernel: None,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Above SHARE_FROM values, a helper thread sums part of the tensors: each tensor's sums stay
    those of a call alone, bit for bit, and in their places."""
    generator = torch.Generator().manual_seed(5)
    tensors = [torch.randn(1, size, generator=generator) for size in (700_000, 3, 600_000, 40_000, 900_000)]
    assert sum(t.numel() for t in tensors) >= fused.SHARE_FROM
    monkeypatch.setenv("COMGRA_KERNEL_HELPER", "1")
    shared, alone = fused.many_row_sums(tensors, share=True), fused.many_row_sums(tensors)
    assert shared is not None and alone is not None
    assert fused._HELPER["executor"] is not None  # the helper was used
    np.testing.assert_array_equal(shared[0], alone[0])
    for sums, tensor in zip(shared[0], tensors):
        np.testing.assert_array_equal(sums, fused.row_sums(tensor))


@pytest.mark.parametrize("setting", [None, "0"])
def test_the_helper_thread_is_off_unless_the_environment_asks(kernel: None, monkeypatch: pytest.MonkeyPatch,
                                                             setting: str | None) -> None:
    """Without COMGRA_KERNEL_HELPER=1 a call that could be shared runs on the caller's thread alone."""
    generator = torch.Generator().manual_seed(6)
    tensors = [torch.randn(1, size, generator=generator) for size in (700_000, 600_000)]
    expected = fused.many_row_sums(tensors)
    calls: list[object] = []
    monkeypatch.setattr(fused, "_helper", lambda: calls.append(1) or pytest.fail("the helper was asked"))
    if setting is None:
        monkeypatch.delenv("COMGRA_KERNEL_HELPER", raising=False)
    else:
        monkeypatch.setenv("COMGRA_KERNEL_HELPER", setting)
    alone = fused.many_row_sums(tensors, share=True)
    assert not calls and alone is not None and expected is not None
    np.testing.assert_array_equal(alone[0], expected[0])
    monkeypatch.setenv("COMGRA_KERNEL_HELPER", "1")  # positive control: the same call is shared when asked
    with pytest.raises(pytest.fail.Exception):
        fused.many_row_sums(tensors, share=True)


def test_the_variance_of_values_far_from_zero_needs_no_second_pass(kernel: None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """BatchNorm weights near 1 with a small spread: the shifted sums give the std in one pass."""
    array = (1.0 + 1e-3 * np.random.default_rng(4).standard_normal((2, 50_000))).astype(np.float32)

    def second_pass(*args: object) -> None:
        raise AssertionError("a second pass over the values")
    monkeypatch.setattr(stats, "_square_deviations_on_cpu", second_pass)
    per_sample = summarize([torch.from_numpy(array)], batch_size=2, max_neurons=[0]).per_sample[:, 0].numpy()
    expected = reference_statistics(array)
    np.testing.assert_allclose(per_sample[:, 2], expected[:, 2], rtol=1e-5)
    assert_float32_close(per_sample, expected, 1.0)


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


def test_a_shift_that_overflows_takes_the_eager_path(kernel: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel sums x - k, with k the mean of the first 16 values: near float32's limit x - k can
    overflow where |x| sums to a finite number, and such a row must not keep the kernel's sign-flipped
    mean (here -inf, where the true mean is positive and the eager path says +inf)."""
    array = np.zeros((1, 20_000), dtype=np.float32)
    array[0, :16], array[0, 15_000] = 2e38, -2e38
    tensors = [torch.from_numpy(array)]
    with_kernel = summarize(tensors, batch_size=1, max_neurons=[0]).per_sample.numpy()
    monkeypatch.setattr(stats, "FUSED", False)
    eager = summarize(tensors, batch_size=1, max_neurons=[0]).per_sample.numpy()
    np.testing.assert_array_equal(with_kernel, eager)


def _fresh_state(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(fused, "_BUILD", fused._new_build())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("COMGRA_FUSED_KERNEL", raising=False)  # these tests say for themselves whether it is on


def _wait_for_build() -> None:
    for thread in threading.enumerate():
        if thread.name == "comgra-kernel-build":
            thread.join(60)


def test_a_failing_compiler_leaves_the_eager_path(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    _fresh_state(monkeypatch, tmp_path)
    monkeypatch.setattr(fused, "_compiler", lambda: "/bin/false")
    assert fused.row_sums(torch.ones(2, 50_000)) is None  # the build starts on a thread; eager meanwhile
    _wait_for_build()
    assert fused._BUILD.failed and fused.row_sums(torch.ones(2, 50_000)) is None
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


@st.composite
def groups_of_rows(draw: st.DrawFn) -> list[np.ndarray]:
    """Tensors of one batch size with the cases the finishing tells apart: a large offset against a small
    spread (the variance cancels), NaN, inf, all zeros, negative zeros, one value."""
    rows = draw(st.integers(1, 5))
    tensors = []
    for _ in range(draw(st.integers(1, 6))):
        width = draw(st.sampled_from([1, 2, 17, 300, 2_000]))
        seed = draw(st.integers(0, 2**31 - 1))
        scale, offset = draw(st.sampled_from([1e-4, 1.0, 1e3])), draw(st.sampled_from([0.0, 1.0, 1e2, 1e4]))
        values = (np.random.default_rng(seed).standard_normal((rows, width)) * scale + offset).astype(np.float32)
        case = draw(st.sampled_from(["plain", "nan", "inf", "zeros", "negative zeros"]))
        if case == "nan":
            values[-1, 0] = np.nan
        elif case == "inf":
            values[0, -1] = -np.inf
        elif case in ("zeros", "negative zeros"):
            values[:] = 0.0 if case == "zeros" else -0.0
        tensors.append(values)
    return tensors


@settings(max_examples=150, deadline=None)
@given(groups_of_rows())
def test_finish_in_the_kernel_equals_numpy_to_the_bit(kernel: None, arrays: list[np.ndarray]) -> None:
    """fused.finish gives the NumPy finishing's float32 statistics bit for bit, and leaves to it exactly
    the tensors that need its exact path (NaN or inf to count, a variance that cancels)."""
    flats = [torch.from_numpy(a) for a in arrays]
    sums = stats._all_cpu_sums(flats)
    widths = np.array([a.shape[1] for a in arrays], dtype=np.float64)
    expected = stats._finish_on_host(flats, sums, widths[:, None])
    finished = fused.finish(sums, widths)
    assert finished is not None
    result, rare = finished
    with np.errstate(all="ignore"):
        shifted = sums[:, 0] / widths[:, None]
        variance = sums[:, 1] / widths[:, None] - shifted * shifted
        needs_exact = ~(np.isfinite(sums[:, 2]) & np.isfinite(variance) & (variance * 3 >= shifted * shifted)).all(1)
    assert rare.tolist() == np.flatnonzero(needs_exact).tolist()
    common = np.flatnonzero(~needs_exact)
    np.testing.assert_array_equal(result[:, common].view(np.uint32), expected[:, common].view(np.uint32))
    # and through the whole path, the rare tensors included
    np.testing.assert_array_equal(stats._cpu_large_statistics(flats).view(np.uint32), expected.view(np.uint32))


@settings(max_examples=120, deadline=None)
@given(groups_of_rows(), st.lists(st.integers(0, 40), min_size=6, max_size=6), st.integers(0, 2))
def test_the_summary_without_views_equals_the_summary_through_views_to_the_bit(
        kernel: None, arrays: list[np.ndarray], caps: list[int], shape_of: int) -> None:
    """stats.summarize reads contiguous float32 tensors in the kernel with no view of any of them (sums and
    first values: fused.read_rows); every number equals that of the path through views, bit for bit,
    NaN, inf, cancelling variances and caps of 0 or above the width included, whatever the tensors' shape."""
    rows = arrays[0].shape[0]
    tensors = [torch.from_numpy(_reshaped(a, shape_of)) for a in arrays]
    caps = caps[:len(arrays)]
    assert stats._summary_in_the_kernel(tensors, rows, caps) is not None  # the path under test is taken
    without_views = summarize(tensors, batch_size=rows, max_neurons=caps)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stats, "_summary_in_the_kernel", lambda *_: None)
        through_views = summarize(tensors, batch_size=rows, max_neurons=caps)
    for name in ("per_sample", "neurons"):
        ours, theirs = getattr(without_views, name).numpy(), getattr(through_views, name).numpy()
        assert ours.shape == theirs.shape
        np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    assert without_views.kept.tolist() == through_views.kept.tolist()
    assert without_views.sizes == through_views.sizes
    assert without_views.neuron_slices == through_views.neuron_slices


def _reshaped(values: np.ndarray, shape_of: int) -> np.ndarray:
    """(B, D) as (B, D), as (B, 1, D) or, where D is even, as (B, 2, D / 2): what a conv map looks like."""
    if shape_of == 1:
        return values[:, None, :]
    if shape_of == 2 and values.shape[1] % 2 == 0:
        return values.reshape(values.shape[0], 2, -1)
    return values


def test_what_the_kernel_cannot_read_without_a_view_takes_the_path_through_views(kernel: None) -> None:
    """Not float32, not contiguous, empty: read_rows declines the whole group, and the summary is still right."""
    base = torch.arange(24, dtype=torch.float32).reshape(2, 12)
    for odd in (base.double(), base[:, ::2], base.t().contiguous().t(), torch.zeros(2, 0)):
        tensors = [base, odd]
        assert fused.read_rows(tensors, 2, [3, 3]) is None
        summary = summarize(tensors, batch_size=2, max_neurons=[3, 3])
        np.testing.assert_array_equal(summary.neurons[:, :3].numpy(), base[:, :3].numpy())
    assert fused.read_rows([base], 2, [3]) is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8,
                                   torch.uint8, torch.bool])
@pytest.mark.parametrize("special", [None, float("nan"), float("inf"), -float("inf")])
def test_the_sentinels_reductions_in_the_kernel_equal_torchs(kernel: None, dtype: torch.dtype,
                                                             special: float | None) -> None:
    """fused.extremes: what breakpoints/sentinels.py takes from torch (aminmax, vector_norm of the values as float64),
    for every type it reads; NaN anywhere gives NaN extremes, as aminmax; None where torch must do it."""
    values = (torch.randn(3, 41, generator=torch.Generator().manual_seed(2)) * 50)
    if special is not None:
        if not dtype.is_floating_point:
            return
        values[1, 7] = special
    values = values.to(dtype)
    low, high, norm = fused.extremes(values)
    wide = values.double()
    expected_low, expected_high = (float(v) for v in torch.aminmax(wide))
    for found, expected in ((low, expected_low), (high, expected_high), (norm, float(torch.linalg.vector_norm(wide)))):
        assert (found != found and expected != expected) or found == pytest.approx(expected, rel=1e-12)
    assert fused.extremes(values.t()) is None or values.t().is_contiguous()  # a transposed view: torch's path
    assert fused.extremes(values[:0]) is None  # empty: the sentinels say so themselves
    limit = fused.EXTREMES_FLOAT_UP_TO if dtype.is_floating_point else fused.EXTREMES_UP_TO
    assert fused.extremes(torch.zeros(limit, dtype=dtype)) is not None
    assert fused.extremes(torch.zeros(limit + 1, dtype=dtype)) is None  # large: torch's vectorised kernels
    assert fused.extremes(torch.zeros(3, dtype=torch.complex64)) is None


@pytest.mark.parametrize("size", [1, 15, 16, 17, 47, 64, 1000, 4099])
def test_float_reductions_in_vector_lanes_and_the_tail_equal_numpys(kernel: None, size: int) -> None:
    """The kernel's float32 loops (four float64 lanes at a time where the compiler has vector types, the rest one at a
    time): the sentinels' extremes and the fingerprints' wide sums against NumPy in float64, with a NaN, an inf or a
    -0.0 at the first value, in the middle, at the last of the vector part and in the tail."""
    base = (np.random.default_rng(size).standard_normal(size) * 1e3).astype(np.float32)
    positions = sorted({0, size // 2, max(0, size - size % 16 - 1), size - 1})
    for position in positions:
        for special in (None, np.nan, np.inf, -np.inf, -0.0):
            values = base.copy()
            if special is not None:
                values[position] = special
            tensor = torch.from_numpy(values)
            wide = values.astype(np.float64)
            low, high, norm = fused.extremes(tensor)
            if special is not None and np.isnan(special):
                assert math.isnan(low) and math.isnan(high) and math.isnan(norm), (position, special)
            else:
                assert (low, high) == (wide.min(), wide.max()), (position, special)
                assert norm == pytest.approx(float(np.sqrt((wide * wide).sum())), rel=1e-12)
            (total, squares), = fused.wide_sums([tensor])
            expected = (wide.sum(), (wide * wide).sum())
            for found, wanted in zip((total, squares), expected):
                assert (math.isnan(found) and math.isnan(wanted)) or found == pytest.approx(wanted, rel=1e-9, abs=1e-6)

"""Comparisons of recorded statistics with NumPy's, shared by the statistics tests."""
from __future__ import annotations

import warnings

import numpy as np


def assert_float32_close(actual: np.ndarray, expected: np.ndarray, scale: float) -> None:
    """NaN where NumPy has NaN, the same infinities, finite values within float32 rounding of ``scale``."""
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    np.testing.assert_array_equal(np.isposinf(actual), np.isposinf(expected))
    np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-5, atol=1e-5 * (scale + 1.0))


def reference_statistics(flat: np.ndarray) -> np.ndarray:
    """(B, D) -> (B, 8) in float64, in the order of comgra.capture.stats.STATISTICS."""
    flat = flat.astype(np.float64)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.stack([flat.mean(1), np.abs(flat).mean(1), flat.std(1), flat.min(1), flat.max(1),
                         np.abs(flat).max(1), np.isnan(flat).sum(1), np.isinf(flat).sum(1)], axis=1)

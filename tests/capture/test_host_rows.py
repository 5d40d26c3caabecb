"""On the CPU a step's batch aggregates and chosen samples are taken in NumPy (capture/summaries.py,
``_arrays_on_host``); on a device in torch with one transfer (``_arrays_in_one_transfer``). Both must
give the same rows, NaN and inf included, and match an independent NumPy computation."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from comgra.capture import summaries
from comgra.capture.registry import Registration


def _blocks() -> list[summaries.Block]:
    generator = torch.Generator().manual_seed(3)
    batched = torch.randn(6, 5, 7, generator=generator) * 3 + 1
    batched[2, 1, 3] = float("nan")
    batched[4, 0, 0] = float("inf")
    other = torch.randn(6, 40, generator=generator)
    weight = torch.randn(4, 30, generator=generator)
    items = [(Registration("a", 0, "a", "a", "calculated", "neuron", 0, True, (6, 5, 7), None), batched),
             (Registration("b", 0, "b", "b", "calculated", "kpis", 0, False, (6, 40), None), other),
             (Registration("w", -1, "w", "w", "parameter", "neuron", None, False, (4, 30), None), weight)]
    return summaries.summarize_values("forward", items, max_neurons=3, with_svd=True)


@pytest.mark.parametrize("indices", [[0, 3, 5], [], [4]])
def test_rows_on_the_host_equal_the_rows_of_one_transfer(indices: list[int]) -> None:
    blocks, choice = _blocks(), summaries.SampleChoice(indices)
    on_host = summaries._arrays_on_host(blocks, choice)
    transferred = summaries._arrays_in_one_transfer(blocks, choice)
    assert len(on_host) == len(transferred) == 2  # the batched tensors, the parameter
    for (stats, neurons, svd), (stats_t, neurons_t, svd_t) in zip(on_host, transferred):
        assert stats.dtype == stats_t.dtype == np.float32
        np.testing.assert_allclose(stats, stats_t, rtol=1e-6, atol=1e-6, equal_nan=True)
        np.testing.assert_allclose(neurons, neurons_t, rtol=1e-6, atol=1e-6, equal_nan=True)
        assert (svd is None) == (svd_t is None)
        if svd is not None:
            np.testing.assert_array_equal(svd, svd_t)


def test_batch_aggregates_on_the_host_match_numpy_in_float64() -> None:
    blocks = _blocks()
    stats = blocks[0].summary.per_sample.numpy()  # (B, S, 8)
    aggregates = summaries._batch_aggregates_on_host(stats)
    wide = stats.astype(np.float64)
    with np.errstate(invalid="ignore"):
        expected = np.stack([wide.mean(0), wide.std(0), np.abs(wide).max(0)])
    np.testing.assert_allclose(aggregates, expected, rtol=1e-5, atol=1e-6, equal_nan=True)
    # NaN and inf reach the aggregates: the per-sample means of samples 2 and 4 are NaN and inf
    assert np.isnan(aggregates[0, 0, 0]) and np.isnan(stats[2, 0, 0]) and np.isinf(stats[4, 0, 0])

"""Statistics against NumPy: ``summarize`` on the device, and the rows that end up in the store."""
from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from comgra.capture import fused, spectral, stats
from comgra.capture.stats import STATISTICS, batch_aggregates, summarize
from comgra.capture.summaries import IMAGE_VALUES, image_shaped
from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder
from comgra.store import GroupReader
from comgra.store.format import STATISTICS as STORED_STATISTICS
from numeric_checks import assert_float32_close, reference_statistics  # beside this file

SPECIAL = st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0])
FINITE = st.floats(min_value=-1e4, max_value=1e4, width=32, allow_nan=False, allow_infinity=False)
VALUES = st.one_of(FINITE, FINITE, FINITE, SPECIAL)  # mostly finite, some NaN and inf
VALUE_SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)


def reference_over_batch(per_sample: np.ndarray) -> np.ndarray:
    """(B, ...) -> (3, ...): mean, population std and max |.| over the batch."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.stack([per_sample.mean(0), per_sample.std(0), np.abs(per_sample).max(0)])


def _scale(*arrays: np.ndarray) -> float:
    finite = [np.abs(a[np.isfinite(a)]) for a in arrays]
    return max((float(f.max()) for f in finite if f.size), default=0.0)


def test_statistics_are_in_the_stored_order() -> None:
    assert STATISTICS == STORED_STATISTICS == ("mean", "abs_mean", "std", "min", "max", "abs_max",
                                                "nan_count", "inf_count")


@st.composite
def batches_of_tensors(draw: st.DrawFn) -> tuple[int, list[np.ndarray], list[int]]:
    batch = draw(st.integers(1, 4))
    count = draw(st.integers(1, 4))
    arrays = [draw(hnp.arrays(np.float32, (batch, *draw(VALUE_SHAPES)), elements=VALUES)) for _ in range(count)]
    caps = [draw(st.integers(0, 70)) for _ in range(count)]
    return batch, arrays, caps


@settings(max_examples=150, deadline=None)
@given(batches_of_tensors())
def test_summarize_matches_numpy(case: tuple[int, list[np.ndarray], list[int]]) -> None:
    batch, arrays, caps = case
    summary = summarize([torch.from_numpy(a) for a in arrays], batch_size=batch, max_neurons=caps)
    assert summary.per_sample.shape == (batch, len(arrays), len(STATISTICS))
    for i, (array, cap) in enumerate(zip(arrays, caps)):
        flat = array.reshape(batch, -1)
        assert summary.sizes[i] == flat.shape[1]
        assert_float32_close(summary.per_sample[:, i].numpy(), reference_statistics(flat), _scale(flat))
        start, stop = summary.neuron_slices[i]
        assert stop - start == min(cap, flat.shape[1])
        np.testing.assert_array_equal(summary.neurons[:, start:stop].numpy(), flat[:, :stop - start])


@st.composite
def rows_and_chunk(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    """A (B, D) array with an offset that makes E[x^2] - E[x]^2 cancel, and a chunk size that splits it."""
    batch, width = draw(st.integers(1, 4)), draw(st.integers(1, 40))
    offset = draw(st.sampled_from([0.0, 1e3, -3e3]))
    array = draw(hnp.arrays(np.float32, (batch, width), elements=VALUES)) + np.float32(offset)
    return array, draw(st.integers(1, 3 * batch * width))


@settings(max_examples=150, deadline=None)
@given(rows_and_chunk())
def test_large_tensor_paths_match_numpy(case: tuple[np.ndarray, int]) -> None:
    """The paths for large tensors, at sizes where every chunk boundary and special value shows: the CPU
    path merging chunks of ``chunk`` elements, the one-pass kernel, the NumPy path of small tensors, and the
    float64-accumulating GPU path (run on the CPU)."""
    array, chunk = case
    expected = reference_statistics(array)
    fused.ensure_built()  # loaded from the cache after the first example
    original = stats.CHUNK, stats.SUMS_ON_HOST_UP_TO, stats.FUSED
    try:
        stats.CHUNK, stats.SUMS_ON_HOST_UP_TO, stats.FUSED = chunk, 0, False  # every size: chunked torch and BLAS
        chunked = stats._large_statistics([torch.from_numpy(array)])[:, 0].numpy()
        stats.FUSED = True  # the one-pass kernel where it is built (capture/fused.py), else chunked again
        one_pass = stats._large_statistics([torch.from_numpy(array)])[:, 0].numpy()
    finally:
        stats.CHUNK, stats.SUMS_ON_HOST_UP_TO, stats.FUSED = original
    assert_float32_close(chunked, expected, _scale(array))
    assert_float32_close(one_pass, expected, _scale(array))
    on_host = stats._large_statistics([torch.from_numpy(array)])[:, 0].numpy()  # small: NumPy in float64
    assert_float32_close(on_host, expected, _scale(array))
    on_gpu = stats._large_statistics([torch.from_numpy(array)], accelerator=True)[:, 0].numpy()
    assert_float32_close(on_gpu, expected, _scale(array))


@pytest.mark.parametrize("offset, spread", [(0.0, 1.0), (1.0, 1e-3), (1e3, 1e-2), (-50.0, 0.0)])
def test_std_of_a_large_tensor_has_float32_precision(offset: float, spread: float) -> None:
    """Millions of values far from zero relative to their spread (BatchNorm weights, biased activations):
    the std must not come from E[x^2] - E[x]^2 in float32, which would be off by orders of magnitude."""
    generator = np.random.default_rng(0)
    array = (offset + spread * generator.standard_normal((1, 3_000_000))).astype(np.float32)
    summary = summarize([torch.from_numpy(array)], batch_size=1, max_neurons=[0])
    actual = summary.per_sample[0, 0].numpy().astype(np.float64)
    expected = reference_statistics(array)[0]
    np.testing.assert_allclose(actual[:6], expected[:6], rtol=2e-5, atol=1e-6 * (abs(offset) + spread))
    assert actual[6] == actual[7] == 0


def test_nan_and_inf_are_counted_in_a_large_tensor() -> None:
    array = np.zeros((2, 300_000), dtype=np.float32)
    array[0, [5, 299_999]] = np.nan
    array[1, 7] = -np.inf
    array[1, 100_000] = np.inf
    per_sample = summarize([torch.from_numpy(array)], batch_size=2, max_neurons=[0]).per_sample[:, 0].numpy()
    assert per_sample[:, 6].tolist() == [2, 0] and per_sample[:, 7].tolist() == [0, 2]
    assert np.isnan(per_sample[0, :6]).all() and np.isnan(per_sample[1, 0])  # mean of -inf and inf
    assert per_sample[1, 3] == -np.inf and per_sample[1, 4] == per_sample[1, 5] == np.inf


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5), elements=VALUES))
def test_batch_aggregates_match_numpy(values: np.ndarray) -> None:
    actual = batch_aggregates(torch.from_numpy(values)).numpy()
    assert_float32_close(actual, reference_over_batch(values.astype(np.float64)), _scale(values))


@st.composite
def registered_tensors(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    batch = draw(st.integers(1, 4))
    array = draw(hnp.arrays(np.float32, (batch, *draw(VALUE_SHAPES)), elements=VALUES))
    return array, draw(st.integers(1, 30))


@settings(max_examples=20, deadline=None)
@given(registered_tensors())
def test_stored_rows_are_numpy_statistics_of_the_registered_tensor(case: tuple[np.ndarray, int]) -> None:
    array, max_neurons = case
    batch = array.shape[0]
    with tempfile.TemporaryDirectory() as root:
        recorder = ComgraRecorder(root, "group", "trial", DecisionMakerForRecordingsHardcoded({0}),
                                  max_num_neurons_to_record=max_neurons, flush_seconds=0.01)
        recorder.start_batch(0, batch)
        recorder.start_iteration()
        tensor = torch.from_numpy(array.copy())
        recorder.register_tensor("t", tensor, is_input=True)
        recorder.register_tensor("u", tensor * 2)  # a second tensor in the same block, connected to t
        recorder.finish_iteration()
        recorder.finish_batch()
        recorder.finalize()
        rows = GroupReader(Path(root) / "group").trial("trial").selection(training_step=0, node="t").to_pylist()

    flat = array.reshape(batch, -1).astype(np.float64)
    per_sample = reference_statistics(flat)
    whole = flat.shape[1]  # an image-shaped value keeps each sample's whole image (capture/summaries.py)
    kept = whole if image_shaped(array.shape, 0) and whole <= IMAGE_VALUES else min(max_neurons, whole)
    expected = {("sample", k): (per_sample[k], flat[k, :kept]) for k in range(batch)}
    over_batch_stats, over_batch_neurons = reference_over_batch(per_sample), reference_over_batch(flat[:, :kept])
    for j, aggregation in enumerate(("mean", "std", "abs_max")):
        expected[(aggregation, -1)] = (over_batch_stats[j], over_batch_neurons[j])
    found = {(r["aggregation"], r["sample"]): r for r in rows}
    assert set(found) == set(expected)
    scale = _scale(flat)
    for key, (statistics, neurons) in expected.items():
        row = found[key]
        assert row["shape"] == list(array.shape) and row["num_neurons"] == flat.shape[1]
        assert_float32_close([row[name] for name in STORED_STATISTICS], statistics, max(scale, _scale(statistics)))
        assert_float32_close(np.array(row["neurons"], dtype=np.float64), neurons, scale)


# -- spectral norms ------------------------------------------------------------------------------

def _spectra() -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    random = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    return [
        ("gaussian 300x200 (clustered top values)", random(300, 200) / 15),
        ("wide 96x700", random(96, 700)),
        ("low rank plus noise, like a gradient", random(400, 3) @ random(3, 150) + 1e-3 * random(400, 150)),
        ("rank one", random(128, 1) @ random(1, 90)),
        ("two equal top values", torch.diag(torch.tensor([5.0, 5.0] + [1.0] * 98))),
        ("small, exact path", random(40, 7)),
        ("one row", random(1, 50)),
        ("zeros", torch.zeros(80, 70)),
    ]


@pytest.mark.parametrize("accelerator", [False, True], ids=["cpu-lanczos", "gpu-path-on-cpu"])
def test_largest_singular_values_match_matrix_norm(accelerator: bool) -> None:
    names, matrices = zip(*_spectra())
    found = spectral.largest_singular_values(list(matrices), accelerator=accelerator).double()
    expected = torch.stack([torch.linalg.matrix_norm(m.double(), ord=2) for m in matrices])
    for name, value, reference in zip(names, found.tolist(), expected.tolist()):
        assert value == pytest.approx(reference, rel=1e-4, abs=1e-6), name


def test_warm_started_spectral_norm_follows_a_changing_matrix() -> None:
    """The start vector kept from the previous step must not bias the next one: each step's value is
    the norm of that step's matrix, also after the top direction changed completely."""
    generator = torch.Generator().manual_seed(5)
    matrix = torch.randn(500, 120, generator=generator) / 20
    key = ("gradients", "test_warm_started", 0)
    for step in range(6):
        if step == 3:  # a new dominant direction, orthogonal to the old vector's neighbourhood
            matrix = matrix + 4 * torch.randn(500, 1, generator=generator) @ torch.randn(1, 120, generator=generator)
        matrix = matrix + 1e-3 * torch.randn(500, 120, generator=generator)
        (value,) = spectral.largest_singular_values([matrix], keys=[key]).tolist()
        assert value == pytest.approx(torch.linalg.matrix_norm(matrix.double(), ord=2).item(), rel=1e-4), step


def test_spectral_norm_of_a_matrix_with_nan_is_nan() -> None:
    big, small = torch.randn(200, 100), torch.randn(20, 10)
    big[3, 4] = small[1, 2] = float("nan")
    for accelerator in (False, True):
        assert torch.isnan(spectral.largest_singular_values([big, small], accelerator=accelerator)).all()


# -- parameter statistics on the worker thread --------------------------------------------------

class _Wide(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1500, 1500)  # 2.25M values: the worker is still busy at the step


@pytest.mark.parametrize("update", ["optimizer", "manual_data", "no_grad_inplace"])
def test_parameters_are_recorded_before_the_update_of_the_same_step(update: str) -> None:
    """The parameters' statistics run on a worker thread from start_iteration on; whatever updates
    the parameters after the backward pass, the recorded values are those before the update."""
    torch.manual_seed(0)
    model = _Wide()
    optimizer = torch.optim.SGD(model.parameters(), lr=10.0)  # a large step: the update is visible
    with tempfile.TemporaryDirectory() as root:
        recorder = ComgraRecorder(root, "group", "trial", DecisionMakerForRecordingsHardcoded({0, 1}),
                                  calculate_svd_and_other_expensive_operations_of_parameters=True, flush_seconds=0.01)
        recorder.track_module("model", model)
        before = {}
        for step in range(2):
            before[step] = model.layer.weight.detach().clone()
            recorder.start_batch(step, 4)
            recorder.start_iteration()
            x = torch.randn(4, 1500)
            recorder.register_tensor("x", x, is_input=True)
            y = model.layer(x)
            recorder.register_tensor("y", y)
            loss = (y * y).mean()
            recorder.register_tensor("loss", loss, is_loss=True)
            optimizer.zero_grad()
            loss.backward()
            if update == "optimizer":
                optimizer.step()
            elif update == "manual_data":
                model.layer.weight.data -= 10.0 * model.layer.weight.grad
            else:
                with torch.no_grad():
                    model.layer.weight -= 10.0 * model.layer.weight.grad
            recorder.record_current_gradients("gradients")
            recorder.finish_iteration()
            recorder.finish_batch()
        recorder.finalize()
        trial = GroupReader(Path(root) / "group").trial("trial")
        for step, weight in before.items():
            (row,) = trial.selection(training_step=step, kind="forward", node="model.layer.weight").to_pylist()
            flat = weight.double().reshape(1, -1).numpy()
            assert_float32_close([row[name] for name in STORED_STATISTICS], reference_statistics(flat)[0],
                                 _scale(flat))
            assert row["svd_max"] == pytest.approx(torch.linalg.matrix_norm(weight.double(), ord=2).item(), rel=1e-4)


def test_a_parameter_changed_in_place_before_the_wait_is_computed_again() -> None:
    """A version counter that moved while the worker ran means its result may mix old and new
    values: the job is computed again on the caller's thread (here: the value after the change)."""
    from comgra.capture import background
    tensor = torch.randn(1 << 20)

    def compute(items: list[tuple[str, torch.Tensor]]) -> float:
        return float(items[0][1].double().sum())

    job = background.Job(compute, [("t", tensor)])
    tensor.add_(1.0)
    assert job.result() == pytest.approx(float(tensor.double().sum()))
    untouched = background.Job(compute, [("t", tensor)])
    assert untouched.result() == pytest.approx(float(tensor.double().sum()))


# -- gradient statistics at record time ---------------------------------------------------------

@pytest.mark.parametrize("edit", ["none", "data_clamp", "clip_grad_norm", "second_backward", "zero_in_place"])
def test_gradient_statistics_are_those_at_record_time(edit: str) -> None:
    """Any change of a parameter's gradient between the backward pass and record_current_gradients
    (even through ``.data``, which no version counter sees) must give the statistics of the gradient
    at the call."""
    from comgra.capture import background
    torch.manual_seed(1)
    model = _Wide()
    with tempfile.TemporaryDirectory() as root:
        recorder = ComgraRecorder(root, "group", "trial", DecisionMakerForRecordingsHardcoded({0}), flush_seconds=0.01,
                                  calculate_svd_and_other_expensive_operations_of_parameters=True)
        recorder.track_module("model", model)
        recorder.start_batch(0, 4)
        recorder.start_iteration()
        x = torch.randn(4, 1500)
        recorder.register_tensor("x", x, is_input=True)
        y = model.layer(x)
        recorder.register_tensor("y", y)
        loss = (y * y).mean() * 1e3
        recorder.register_tensor("loss", loss, is_loss=True)
        loss.backward(retain_graph=True)
        background._executor().submit(lambda: None).result()  # anything queued on the worker has run: edits come late
        grad = model.layer.weight.grad
        if edit == "data_clamp":
            grad.data.clamp_(-0.01, 0.01)
        elif edit == "clip_grad_norm":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        elif edit == "second_backward":
            loss.backward()
        elif edit == "zero_in_place":
            grad.zero_()
        expected = model.layer.weight.grad.detach().clone()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
        recorder.finalize()
        trial = GroupReader(Path(root) / "group").trial("trial")
        (row,) = trial.selection(training_step=0, kind="gradients", node="model.layer.weight").to_pylist()
    flat = expected.double().reshape(1, -1).numpy()
    assert_float32_close([row[name] for name in STORED_STATISTICS], reference_statistics(flat)[0], _scale(flat))
    assert row["svd_max"] == pytest.approx(torch.linalg.matrix_norm(expected.double(), ord=2).item(), rel=1e-4, abs=1e-9)

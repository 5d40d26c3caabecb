"""A tensor's distribution across steps (issue 25, item 9): percentiles of the stored values and the exact
min and max statistics, per trial, computed here from the store's rows with NumPy."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from comgra.server import figures
from comgra.service import RecordingService
from comgra.service.distributions import PERCENTILES, distributions
from comgra.store import GroupReader


@pytest.mark.parametrize("aggregation", ["mean", "none"])
def test_percentiles_and_extremes_equal_the_stores_rows(recording: Path, aggregation: str) -> None:
    service = RecordingService(recording)
    selection = service.resolve({}).selection
    if aggregation == "none":  # a tensor without a batch dimension: a parameter
        trial = GroupReader(recording).trial(selection.trial)
        rows = [r for r in trial.selection(training_step=selection.training_step, aggregation="none").to_pylist()
                if r["tensor_type"] == "parameter"]
        selection = service.resolve({"trial": selection.trial, "training_step": selection.training_step,
                                     "node_id": rows[0]["node"]}).selection
        assert selection.aggregation == "none"
    else:
        assert selection.aggregation == "mean"
    found = distributions(service, selection)
    assert [d.trial for d in found] == service.trials()
    for entry in found:
        trial = GroupReader(recording).trial(entry.trial)
        batched = selection.aggregation != "none"
        expected_steps = []
        for step in trial.steps()["training_step"].to_pylist():
            rows = [r for r in trial.selection(training_step=step, node=selection.node, role=selection.role,
                                               kind=selection.kind, iteration=selection.data_iteration).to_pylist()
                    if r["aggregation"] == ("sample" if batched else "none")]
            if rows and step not in expected_steps:
                expected_steps.append(step)
                index = list(entry.steps).index(step)
                pooled = [v for r in rows for v in r["neurons"]]
                assert np.allclose(entry.percentiles[index], np.percentile(pooled, PERCENTILES))
                assert entry.minimum[index] == min(r["min"] for r in rows)
                assert entry.maximum[index] == max(r["max"] for r in rows)
        assert list(entry.steps) == sorted(expected_steps)


def test_the_figure_puts_the_trials_side_by_side_on_one_y_axis(recording: Path) -> None:
    service = RecordingService(recording)
    selection = service.resolve({}).selection
    found = distributions(service, selection)
    figure = figures.distribution_figure(found, title="t", current_step=selection.training_step)
    assert [a.text for a in figure.layout.annotations][:len(found)] == [d.trial for d in found]
    medians = [t for t in figure.data if t.name == "median"]
    assert [list(t.y) for t in medians] == [d.percentiles[:, 4].tolist() for d in found]
    assert figure.layout.yaxis2.matches == "y" or figure.layout.yaxis2.showticklabels is False


def test_histograms_are_numpys_counts_of_the_pooled_stored_values_on_bins_shared_by_the_trials(recording: Path) -> None:
    from comgra.service.distributions import histograms

    service = RecordingService(recording)
    selection = service.resolve({}).selection
    found = histograms(service, selection)
    assert list(found.counts) == service.trials()
    pooled_all = []
    for trial_id, counts in found.counts.items():
        trial = GroupReader(recording).trial(trial_id)
        for index, step in enumerate(found.steps[trial_id]):
            rows = [r for r in trial.selection(training_step=int(step), node=selection.node, role=selection.role,
                                               kind=selection.kind, iteration=selection.data_iteration).to_pylist()
                    if r["aggregation"] == "sample"]
            pooled = np.array([v for r in rows for v in r["neurons"]], dtype=np.float64)
            pooled_all.append(pooled)
            assert counts[index].tolist() == np.histogram(pooled, bins=found.edges)[0].tolist()
    everything = np.concatenate(pooled_all)
    assert found.edges[0] == everything.min() and found.edges[-1] == pytest.approx(everything.max())
    figure = figures.histograms_figure(found, title="t")
    assert [list(map(list, t.z)) for t in figure.data] == [c.tolist() for c in found.counts.values()]


def test_histogram_rows_have_equal_heights_on_unevenly_spaced_steps() -> None:
    """Steps 0, 1, 2, 50, 1000: on a numeric axis the rows of 50 and 1000 would be hundreds of times taller than
    the others; on a category axis ordered by step every step is one row of the same height."""
    from comgra.service.distributions import Histograms

    edges = np.linspace(0.0, 1.0, 5)
    found = Histograms(edges=edges, steps={"a": np.array([0, 1, 2, 50, 1000]), "b": np.array([1, 7])},
                       counts={"a": np.ones((5, 4), dtype=np.int64), "b": np.ones((2, 4), dtype=np.int64)})
    figure = figures.histograms_figure(found, title="t")
    assert [list(t.y) for t in figure.data] == [["0", "1", "2", "50", "1000"], ["1", "7"]]
    for axis in (figure.layout.yaxis, figure.layout.yaxis2):
        assert axis.type == "category" and list(axis.categoryarray) == ["0", "1", "2", "7", "50", "1000"]

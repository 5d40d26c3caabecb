"""The service's findings questions: badges for the graph, links built with view_link, the tab's list."""
from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest

torch = pytest.importorskip("torch")
from planted import Network, mlp, record  # noqa: E402

from comgra.server.findings import filtered, findings_list, series_figure, statistic_series  # noqa: E402
from comgra.service import URL_KEYS, RecordingService, finding_link  # noqa: E402


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    blocks = mlp(4, 16, 1, activation=torch.nn.ReLU)
    with torch.no_grad():
        blocks[0][1][0].bias.fill_(-20.0)
    service = RecordingService(record(tmp_path_factory.mktemp("service"), "dead", Network(blocks, steps=8)))
    yield service
    service.close()


def test_badges_count_the_findings_of_warning_or_above_per_node(service) -> None:
    assert service.finding_badges("dead", wait_seconds=60) == {"layer0": "1 \u26a0"}


def test_link_names_the_selection_in_the_url_keys(service) -> None:
    dead = next(f for f in service.findings("dead") if f.detector == "dead_units")
    query = {k: v[0] for k, v in parse_qs(urlparse(finding_link(dead)).query).items()}
    assert set(query) <= set(URL_KEYS)
    assert query == {"tab": "tensors", "trial": "dead", "step": "0", "iteration": "0", "node": "layer0",
                     "role": "layer0", "kind": "forward", "aggregation": "abs_max", "stat": dead.statistic}


def test_filters_and_the_plotted_statistic_are_the_stores(service) -> None:
    found = service.findings()
    assert [f.detector for f in filtered(found, ["warning"], None, None)] == ["dead_units"]
    assert filtered(found, ["error", "warning", "info"], ["nope"], None) == []
    assert len(filtered(found, None, None, ["dead"])) == len(found)
    assert findings_list(found).children
    dead = filtered(found, ["warning"], None, None)[0]
    series = statistic_series(service, dead)
    assert series is not None and not series.over_iterations  # the selection's iteration holds every flagged step
    steps, values = series.steps, series.values
    table = service.trial("dead").series(node="layer0", role="layer0", iteration=0, aggregation="abs_max",
                                         statistic="abs_mean")
    assert steps == table["training_step"].to_pylist() == list(range(8))
    assert values == table["value"].to_pylist() and set(values) == {0.0}
    figure = series_figure(dead, series)
    assert figure.data[0].y == tuple(values) and list(figure.data[1].x) == dead.steps


def test_findings_at_the_same_steps_are_reported_as_occurring_together() -> None:
    from comgra.analysis import Finding
    from comgra.analysis.cooccurrence import detect

    def outlier(node, steps, column):
        return Finding(detector="outlier", severity="info", score=0.5, trial="t", node=node, role=node,
                       kind="forward", training_step=steps[0], message="", steps=steps, column=column)

    together = detect([outlier("b", [3, 7, 9, 12], 2), outlier("a", [3, 7, 9], 1), outlier("c", [1, 20, 30], 0)],
                      recorded_steps=40)
    assert [(f.node, f.evidence["shared_steps"], f.steps) for f in together] == [("a", 3, [3, 7, 9])]
    assert together[0].evidence["second"] == "outlier@b"

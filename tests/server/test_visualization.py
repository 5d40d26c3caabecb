"""The custom visualization file: loaded once, reloaded on change, errors shown as text."""
from __future__ import annotations

import os

import pytest
from dash import dcc, html

from comgra.server.visualization import VisualizationData, VisualizationFile, as_component
from comgra.service import RecordingService

SELECTION = {"trial": None, "training_step": None, "type_of_execution": "x", "kind": "forward", "iteration": 0,
             "node": "input", "role": "input", "aggregation": "mean", "sample": -1}


@pytest.fixture(scope="module")
def data(recording):
    service = RecordingService(recording)
    selection = service.resolve({}).selection
    return VisualizationData(service, selection.trial, selection.training_step)


def write(path, body: str, mtime: int) -> None:
    path.write_text(body)
    os.utime(path, (mtime, mtime))


def test_the_file_is_loaded_once_and_again_after_a_change(tmp_path, data):
    path = tmp_path / "viz.py"
    write(path, "LOADS = []\nLOADS.append(1)\ndef create_visualization(selection, data):\n    return 'one'\n", 1000)
    viz = VisualizationFile(path)
    assert viz.render(SELECTION, data).children == "one"
    module = viz._module
    assert viz.render(SELECTION, data).children == "one" and viz._module is module  # not re-executed
    write(path, "def create_visualization(selection, data):\n    return html_text()\n"
                "def html_text():\n    return 'two'\n", 2000)
    assert viz.render(SELECTION, data).children == "two"


def test_the_contract_data_values_returns_rows_of_the_step(tmp_path, data):
    path = tmp_path / "viz.py"
    write(path, "def create_visualization(selection, data):\n"
                "    rows = data.values(node=selection['node'], role=selection['role'], aggregation='mean')\n"
                "    return f\"{len(rows)} rows, steps {sorted(set(rows['training_step']))}\"\n", 1000)
    text = VisualizationFile(path).render(SELECTION, data).children
    iterations = data.values(node="input", role="input", aggregation="mean")["iteration"].tolist()
    assert text == f"{len(iterations)} rows, steps [{data.training_step}]" and iterations


@pytest.mark.parametrize("body, expected", [
    ("def create_visualization(selection, data):\n    raise ValueError('boom')\n", "ValueError: boom"),
    ("def create_visualization(selection, data)\n", "SyntaxError"),
    ("x = 1\n", "does not define a function create_visualization"),
    ("import no_such_module_here\n", "ModuleNotFoundError"),
])
def test_errors_become_text_in_the_tab(tmp_path, data, body, expected):
    path = tmp_path / "viz.py"
    write(path, body, 1000)
    box = VisualizationFile(path).render(SELECTION, data)
    assert "alert-danger" in box.className and expected in box.children.children


def test_a_missing_file_is_reported(tmp_path, data):
    box = VisualizationFile(tmp_path / "gone.py").render(SELECTION, data)
    assert "does not exist" in box.children.children


def test_return_values_become_components():
    import plotly.graph_objects as go

    assert isinstance(as_component(go.Figure()), dcc.Graph)
    assert isinstance(as_component("text"), html.Pre)
    assert isinstance(as_component([html.B("a"), "b"]), html.Div)
    assert "returned nothing" in as_component(None).children
    div = html.Div("x")
    assert as_component(div) is div


def test_the_example_file_follows_the_contract(data):
    pytest.importorskip("comgra.examples.custom_visualization")
    from comgra.examples import custom_visualization

    viz = VisualizationFile(custom_visualization.__file__)
    result = viz.render({**SELECTION, "trial": data.trial, "training_step": data.training_step}, data)
    assert isinstance(result, dcc.Graph), result

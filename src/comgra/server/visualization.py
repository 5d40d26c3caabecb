"""Custom visualizations: the Visualization tab shows what a user's file draws.

Start the app with ``comgra --path DIR --visualization-file my_viz.py``. The
file defines one function::

    def create_visualization(selection: dict, data) -> object:
        ...

``selection`` is a plain dict describing what the Tensors tab currently shows:

    trial              str   the trial id
    training_step      int
    type_of_execution  str   the type of the selected training step
    kind               str   "forward" or a gradient group, e.g. "gradients"
    iteration          int   the iteration selected in the graph
    node               str   node name
    role               str   role of the tensor within the node
    aggregation        str   "mean", "std", "abs_max" (over the batch), "sample" or "none"
    sample             int   batch index when aggregation == "sample", else -1

``data.values(*, node, role=None, kind=None, iteration=None, aggregation=None,
sample=None)`` returns a ``pandas.DataFrame`` with the rows of the current
trial and training step that match (``None`` matches everything); its columns
are those of the tensors table (``comgra.store.format.TENSORS_SCHEMA``):
statistics such as ``mean`` and ``abs_max``, and ``neurons`` (the stored
values). Note that parameters and initial values are stored under iteration -1.

The function may return a Dash component, a plotly figure, a string, a list of
these, or None. An exception is shown as text in the tab; the rest of the app
keeps working. The file is loaded once and loaded again only when its
modification time changes, so editing it while the app runs takes effect on
the next selection. Example: ``comgra/examples/custom_visualization.py``.
"""
from __future__ import annotations

import importlib.util
import threading
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from dash import dcc, html
from dash.development.base_component import Component

from comgra.service import RecordingService

FUNCTION = "create_visualization"
_NEVER_LOADED = object()


class VisualizationData:
    """The ``data`` argument: rows of the current trial and training step."""

    def __init__(self, service: RecordingService, trial: str, training_step: int):
        self._service = service
        self.trial = trial
        self.training_step = training_step

    def values(self, *, node: str, role: str | None = None, kind: str | None = None, iteration: int | None = None,
               aggregation: str | None = None, sample: int | None = None) -> Any:
        table = self._service.tensor_rows(self.trial, self.training_step, node=node, role=role, kind=kind,
                                          iteration=iteration, aggregation=aggregation, sample=sample)
        return table.to_pandas()


class VisualizationFile:
    """A user's visualization file, loaded once and again only after it changed on disk."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser().resolve()
        self._module: ModuleType | None = None
        self._mtime: object = _NEVER_LOADED
        self._error: str | None = None
        self._lock = threading.Lock()

    def function(self) -> Any:
        """The user's create_visualization; raises RuntimeError with a readable message if unusable."""
        with self._lock:
            mtime = self.path.stat().st_mtime if self.path.exists() else None
            if mtime != self._mtime:
                self._mtime = mtime
                self._load()
            if self._error is not None:
                raise RuntimeError(self._error)
            return getattr(self._module, FUNCTION)

    def _load(self) -> None:
        self._module, self._error = None, None
        if not self.path.is_file():
            self._error = f"The visualization file {str(self.path)!r} does not exist."
            return
        spec = importlib.util.spec_from_file_location("comgra_user_visualization", self.path)
        if spec is None or spec.loader is None:
            self._error = f"{str(self.path)!r} cannot be loaded as a Python file."
            return
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except BaseException as error:  # noqa: BLE001 - the user's code; shown in the tab
            self._error = f"Loading {self.path.name} failed:\n{_user_traceback(error)}"
            return
        if not callable(getattr(module, FUNCTION, None)):
            self._error = f"{self.path.name} does not define a function {FUNCTION}(selection, data)."
            return
        self._module = module

    def render(self, selection: dict[str, Any], data: VisualizationData) -> Any:
        """What the tab shows for a selection; never raises."""
        try:
            function = self.function()
        except RuntimeError as error:
            return _error_box(str(error))
        try:
            result = function(selection, data)
        except Exception as error:  # noqa: BLE001 - the user's code; shown in the tab
            return _error_box(f"{FUNCTION} raised an exception:\n{_user_traceback(error)}")
        return as_component(result)


def as_component(result: Any) -> Any:
    if result is None:
        return html.P(f"{FUNCTION} returned nothing for this selection.", className="text-muted")
    if isinstance(result, Component):
        return result
    if hasattr(result, "to_plotly_json") and hasattr(result, "data"):
        return dcc.Graph(figure=result)
    if isinstance(result, str):
        return html.Pre(result)
    if isinstance(result, (list, tuple)):
        return html.Div([as_component(item) for item in result])
    return html.Pre(repr(result))


def _user_traceback(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    user = [f for f in frames if "comgra/server" not in f.filename.replace("\\", "/")]
    lines = traceback.format_list(user) + traceback.format_exception_only(type(error), error)
    return "".join(lines)


def _error_box(text: str) -> html.Div:
    return html.Div(html.Pre(text, className="mb-0"), className="alert alert-danger visualization-error", role="alert")

"""The Images tab (TensorBoard's Images): a registered tensor shaped like images, (N, C, H, W) with C of 1 or 3, drawn
as a grid: a row per sample, a column per recorded step (service/images.py reads them)."""
from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from comgra.errors import ComgraError
from comgra.server.dom import attributes
from comgra.service import RecordingService
from comgra.service.images import ImageGrid, ImageTensor, image_grid, image_tensors

CELL_PX = 96  # each image drawn this wide, its pixels kept square and sharp


class ID:
    TENSOR = "images-tensor"
    CAPTION = "images-caption"
    GRID = "images-grid"


def panel() -> html.Div:
    return html.Div(className="images-panel", children=[
        html.Div(className="selector images-tensor", style={"maxWidth": "520px"}, children=[
            html.Label("Tensor shaped like images (N, C, H, W with C of 1 or 3)", htmlFor=ID.TENSOR,
                       className="form-label"),
            dcc.Dropdown(id=ID.TENSOR, clearable=False, placeholder="No tensor shaped like images")]),
        html.P(id=ID.CAPTION, className="text-muted small mt-2", role="status"),
        html.Div(id=ID.GRID, className="images-grid"),
    ])


def register(app: Dash, service: RecordingService, *, tabs: str, current_trial: str, data_version: str) -> None:
    @app.callback(Output(ID.TENSOR, "options"), Output(ID.TENSOR, "value"), Input(tabs, "active_tab"),
                  Input(current_trial, "data"), Input(data_version, "data"), State(ID.TENSOR, "value"))
    def update_tensors(active: str, trial: Any, _version: Any, chosen: Any) -> Any:
        if active != "images":
            return no_update, no_update
        tensors = _tensors(service, trial)
        options = [{"label": t.label if t.whole else f"{t.label}: not drawable", "value": t.key} for t in tensors]
        keys = [t.key for t in tensors]
        drawable = [t.key for t in tensors if t.whole]
        fallback = (drawable or keys)[0] if keys else None
        return options, chosen if chosen in keys else fallback

    @app.callback(Output(ID.GRID, "children"), Output(ID.CAPTION, "children"), Input(tabs, "active_tab"),
                  Input(ID.TENSOR, "value"), Input(current_trial, "data"), Input(data_version, "data"))
    def update_grid(active: str, key: Any, trial: Any, _version: Any) -> Any:
        if active != "images":
            return no_update, no_update
        try:
            trial_id = _trial(service, trial)
            tensors = {t.key: t for t in _tensors(service, trial)}
            if trial_id is None or not tensors:
                return None, ("No registered tensor of this trial is shaped like images: (N, C, H, W) with the batch "
                              "first and C of 1 (grey) or 3 (RGB), registered with register_tensor.")
            tensor = tensors.get(key) if isinstance(key, str) else None
            if tensor is None:
                return None, "Choose a tensor."
            if not tensor.whole:
                size = tensor.channels * tensor.height * tensor.width
                return None, (f"{tensor.label}: {tensor.kept} of its {size} values per sample were recorded, too few "
                              f"to draw it. Record it with max_num_neurons_to_record={size} (ComgraRecorder).")
            grid = image_grid(service.trial(trial_id), tensor)
            return grid_view(grid), caption(grid)
        except ComgraError as error:
            return None, str(error)


def _trial(service: RecordingService, trial: Any) -> str | None:
    known = service.trials()
    return trial if trial in known else (known[0] if known else None)


def _tensors(service: RecordingService, trial: Any) -> list[ImageTensor]:
    trial_id = _trial(service, trial)
    if trial_id is None:
        return []
    steps = service.step_index(trial_id, 0).table["training_step"].to_pylist()
    return image_tensors(service.trial(trial_id), int(steps[-1])) if steps else []


def caption(grid: ImageGrid) -> str:
    low, high = grid.scale
    shown = (f"all {grid.recorded_steps} recorded steps" if len(grid.steps) == grid.recorded_steps else
             f"{len(grid.steps)} of {grid.recorded_steps} recorded steps, evenly spaced")
    return (f"{grid.tensor.label}: samples {grid.samples[0]}-{grid.samples[-1]} (rows) at {shown} (columns). "
            f"Black is {low:.4g}, white {high:.4g}, for every image." if grid.samples else
            f"{grid.tensor.label}: no sample of it is recorded.")


def grid_view(grid: ImageGrid) -> html.Table:
    from _plotly_utils.data_utils import image_array_to_data_uri  # plotly's own PNG writer (pypng), as px.imshow

    height = round(CELL_PX * grid.tensor.height / grid.tensor.width)
    header = html.Tr([html.Th("")] + [html.Th(f"step {s}", className="small") for s in grid.steps])
    rows = [header]
    for sample in grid.samples:
        cells: list[Any] = [html.Th(f"sample {sample}", className="small")]
        for step in grid.steps:
            pixels = grid.pixels(sample, step)
            if pixels is None:
                cells.append(html.Td("not recorded", className="small text-muted"))
                continue
            cells.append(html.Td(html.Img(
                src=image_array_to_data_uri(pixels, backend="pypng"), width=CELL_PX, height=height,
                alt=f"{grid.tensor.node}, sample {sample}, step {step}", title=f"sample {sample} · step {step}",
                style={"imageRendering": "pixelated"}, className="comgra-image",
                **attributes({"data-sample": sample, "data-step": step}))))
        rows.append(html.Tr(cells))
    return html.Table(rows, className="images-table")

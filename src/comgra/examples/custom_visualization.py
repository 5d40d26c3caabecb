"""An example for ``comgra --visualization-file``: the tutorial's running sums, iteration by iteration.

The GUI calls ``create_visualization(selection, data)`` whenever the selection changes while the
"Visualization" tab is open, and shows what it returns: a plotly figure, a Dash component or a
string. ``selection`` holds the current selectors (``trial``, ``training_step``,
``type_of_execution``, ``kind``, ``iteration``, ``node``, ``role``, ``aggregation``, ``sample``);
``data.values(...)`` returns the recorded values of the selected trial and training step.

Here the figure shows how the 5 sequences of the tutorial task add up over the iterations, for
the selected sample or batch statistic: the network must tell whether each line ends above zero.

    comgra --path <group folder> --visualization-file path/to/custom_visualization.py
"""
from __future__ import annotations

from typing import Any, Protocol

import plotly.graph_objects as go

NODE = "helper_partial_sums"
ROLE = "partial_sums"
AGGREGATION_LABELS = {
    "mean": "mean over the batch",
    "std": "STD over the batch",
    "abs_max": "max |value| over the batch",
}


class RecordedValues(Protocol):
    """What the GUI passes as ``data``: one row per recorded tensor value of the selected step."""

    def values(
        self,
        *,
        node: str,
        role: str | None = None,
        kind: str | None = None,
        iteration: int | None = None,
        aggregation: str | None = None,
        sample: int | None = None,
    ) -> Any:  # a pandas.DataFrame; its column ``neurons`` lists the first values of each tensor
        ...


def create_visualization(selection: dict[str, Any], data: RecordedValues) -> go.Figure | str:
    """One line per sequence: its sum so far at each iteration of the selected training step."""
    aggregation = selection["aggregation"]
    if aggregation not in ("std", "abs_max", "sample"):
        aggregation = "mean"  # "none" means no batch dimension, which the partial sums do have
    sample = selection["sample"] if aggregation == "sample" else None
    rows = data.values(node=NODE, role=ROLE, kind="forward", aggregation=aggregation, sample=sample)
    if len(rows) == 0:
        step = selection["training_step"]
        return f"Training step {step} has no '{NODE}'; this example is meant for `comgra-test-run`."
    rows = rows.sort_values("iteration")
    figure = go.Figure()
    for sequence in range(len(rows["neurons"].iloc[0])):
        sums = [neurons[sequence] for neurons in rows["neurons"]]
        name = f"sequence {sequence}"
        figure.add_trace(go.Scatter(x=rows["iteration"], y=sums, mode="lines+markers", name=name))
    figure.add_hline(y=0, line_dash="dot")  # the target is 1 where a line ends above this
    if selection["iteration"] >= 0:
        figure.add_vline(x=selection["iteration"], line_color="red", opacity=0.4)
    shown = f"sample {sample}" if aggregation == "sample" else AGGREGATION_LABELS[aggregation]
    figure.update_layout(
        title=f"Sums so far, {shown}: {selection['trial']}, step {selection['training_step']}",
        xaxis_title="iteration",
        yaxis_title="sum of the inputs so far",
    )
    return figure

"""The Samples, Compare and Graphs tabs in Chromium, checked against the store's rows (read with pyarrow)."""
from __future__ import annotations

import math
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from playwright.sync_api import expect

from comgra.service import parse_aggregation
from comgra.store import layout

BUGGED = "trial_bugged_original_version"
FIXED = "trial_no_activation_function_on_output_layer"

SLOW = 20_000  # ms: on a busy machine a tab's first answer can wait behind the Tensors tab's callbacks
READ_TABLE = """() => Array.from(document.querySelectorAll('#samples-table tr')).map(tr =>
  Object.fromEntries(Array.from(tr.querySelectorAll('td[data-dash-column]'))
    .map(td => [td.getAttribute('data-dash-column'), td.textContent.trim()]))).filter(r => Object.keys(r).length)"""


@pytest.fixture
def app(serve, open_page, recording):
    return open_page(serve(recording), recording)


def store_rows(recording, trial, table="tensors", **equal):
    dataset = ds.dataset(str(layout.trial_partition(recording, table, trial)), format="parquet", partitioning="hive")
    condition = None
    for key, value in equal.items():
        condition = (pc.field(key) == value) if condition is None else condition & (pc.field(key) == value)
    return dataset.to_table(filter=condition).to_pylist()


def choose_option(page, dropdown: str, label: str) -> None:
    page.click(f"#{dropdown}")
    page.locator(".dash-dropdown-option", has_text=label).first.click()
    page.keyboard.press("Escape")


def close(text: str, value: float | None) -> bool:
    if value is None:
        return text == ""
    # Six significant digits, with a typographic minus (d3-format's): equal to the stored value to 1e-5.
    return math.isclose(float(text.replace("\u2212", "-")), value, rel_tol=1e-5, abs_tol=1e-12)


def test_the_samples_table_equals_the_stores_per_sample_rows_and_sorts(app, recording):
    app.choose("trial-select", FIXED)  # the trial with categories
    app.click_node("output")
    app.page.get_by_role("tab", name="Samples").click()
    app.page.click("#samples-add-selected")
    choose_option(app.page, "samples-columns", "helper_partial_sums [partial_sums] · mean")
    expect(app.page.locator("#samples-table th", has_text="output · mean")).to_have_count(1, timeout=SLOW)
    expect(app.page.locator("#samples-table th", has_text="helper_partial_sums [partial_sums]")).to_have_count(1, timeout=SLOW)
    caption = app.page.locator("#samples-caption [data-step]")
    step, iteration = int(caption.get_attribute("data-step")), int(caption.get_attribute("data-iteration"))
    (step_row,) = [r for r in store_rows(recording, FIXED, "steps", training_step=step) if r["iteration"] == iteration]
    shown = app.page.evaluate(READ_TABLE)
    assert sorted(int(r["sample"]) for r in shown) == sorted(step_row["samples"])
    categories = dict(zip(step_row["samples"], step_row["categories"]))
    for row in shown:
        sample = int(row["sample"])
        assert row["category"] == categories[sample] and row["type_of_execution"] == step_row["type_of_execution"]
        for key, node, role in (("output|output|forward|mean", "output", "output"),
                                ("helper_partial_sums|partial_sums|forward|mean", "helper_partial_sums", "partial_sums")):
            (stored,) = store_rows(recording, FIXED, training_step=step, iteration=iteration, node=node, role=role,
                                   kind="forward", aggregation="sample", sample=sample)
            assert close(row[key], stored["mean"]), (key, row, stored["mean"])
    # Sorting by a column orders the rows by its values.
    app.page.locator("#samples-table th[data-dash-column='output|output|forward|mean'] .column-header--sort").click()
    expect(app.page.locator("#samples-table th[data-dash-column='output|output|forward|mean'] .column-header--sort")).to_be_visible()
    app.page.wait_for_function("""() => {
      const v = Array.from(document.querySelectorAll("#samples-table td[data-dash-column='output|output|forward|mean']"))
        .map(td => parseFloat(td.textContent.replace('\u2212', '-')));
      return v.length > 1 && v.every((x, i) => i === 0 || v[i - 1] <= x);
    }""")
    assert not app.errors


def test_the_compare_tab_shows_the_stores_numbers_for_both_selections(app, recording):
    first = app.read()
    app.page.get_by_role("tab", name="Compare").click()
    app.page.click("#compare-pin")
    expect(app.page.locator("#compare-table [data-side='pinned'][data-field='trial']")).to_have_text(BUGGED, timeout=SLOW)
    app.page.get_by_role("tab", name="Tensors").click()
    app.choose("trial-select", FIXED)
    app.wait_for(trial=FIXED)
    second = app.read()
    app.page.get_by_role("tab", name="Compare").click()
    expect(app.page.locator("#compare-table [data-side='shown'][data-field='trial']")).to_have_text(FIXED, timeout=SLOW)
    rows = {}
    for side, shown in (("pinned", first), ("shown", second)):
        aggregation, sample = parse_aggregation(shown["aggregation"])
        (rows[side],) = store_rows(recording, shown["trial"], training_step=int(shown["training_step"]),
                                   node=shown["node"], role=shown["role"], kind=shown["kind"],
                                   iteration=int(shown["iteration"]), aggregation=aggregation, sample=sample)
    cells = app.page.evaluate("""() => Array.from(document.querySelectorAll('#compare-table [data-stat]'))
        .map(e => [e.dataset.side, e.dataset.stat, e.dataset.value])""")
    seen = {(side, stat): value for side, stat, value in cells}
    for stat in ("mean", "min", "max", "std", "abs_max"):
        a, b = rows["pinned"][stat], rows["shown"][stat]
        assert float(seen[("pinned", stat)]) == a and float(seen[("shown", stat)]) == b
        assert float(seen[("delta", stat)]) == pytest.approx(b - a)
    assert not app.errors


def test_the_graphs_tab_overlays_every_trial(app, recording):
    app.page.get_by_role("tab", name="Graphs").click()
    expect(app.page.locator("#kpi-graphs [data-kpi-group]")).to_have_count(2, timeout=SLOW)  # plotly.js loads now
    choose_option(app.page, "kpi-trials", BUGGED)
    choose_option(app.page, "kpi-trials", FIXED)
    lines: dict[str, set] = {}
    for trial in (BUGGED, FIXED):
        for row in store_rows(recording, trial, "kpis"):
            lines.setdefault(row["kpi_group"], set()).add((trial, row["kpi_name"], row["type_of_execution"]))
    ranges: set[tuple[float, ...]] = set()
    for group, expected in lines.items():
        figure = app.page.locator(f"#kpi-graphs [data-kpi-group='{group}']")
        expect(figure).to_have_attribute("data-curves", str(len(expected)), timeout=SLOW)
        figure.locator(".js-plotly-plot .legend").wait_for(timeout=SLOW)
        traces = figure.locator(".js-plotly-plot").evaluate(
            "el => el._fullData.filter(t => t.showlegend !== false).map(t => [t.legendgroup, t.name, t.line.color,"
            " t.line.dash, t.meta])")
        # A colour per trial, a line style per curve (the same in both trials), the legend grouped by trial.
        assert {(group, meta) for group, _, _, _, meta in traces} == {
            (trial, f"{trial} · {name}" + ("" if type_ in ("", None, "main_execution_type") else f" · {type_}"))
            for trial, name, type_ in expected}
        colours = {group: {colour for g, _, colour, _, _ in traces if g == group} for group in (BUGGED, FIXED)}
        assert all(len(c) == 1 for c in colours.values()) and colours[BUGGED] != colours[FIXED]
        dashes = {(name, dash) for _, name, _, dash, _ in traces}
        assert len(dashes) == len({name for _, name, _, _, _ in traces})
        assert "main_execution_type" not in " ".join(figure.locator(".legend").all_text_contents())
        ranges.add(tuple(figure.locator(".js-plotly-plot").evaluate("el => el._fullLayout.xaxis.range")))
    assert len(ranges) == 1  # the figures' x-axes line up
    assert not app.errors


def test_a_matrix_parameter_is_drawn_as_a_heatmap_of_its_stored_values(app, recording):
    app.click_node("subnet_mem")  # a 16 x 32 weight: its values in place, not a histogram
    app.wait_for(node="subnet_mem", role="weight")
    plot = app.page.locator("#histogram-plot .js-plotly-plot")
    expect(plot.locator(".hm")).to_have_count(1, timeout=SLOW)
    z = app.page.evaluate("() => document.querySelector('#histogram-plot .js-plotly-plot').data[0].z")
    shown = app.read()
    (stored,) = store_rows(recording, shown["trial"], training_step=int(shown["training_step"]), node="subnet_mem",
                           role="weight", kind=shown["kind"], iteration=-1, aggregation="none")
    whole_rows = min(16, len(stored["neurons"]) // 32)  # the recorder may have kept only the first values
    assert len(z) == whole_rows >= 1 and all(len(row) == 32 for row in z)
    assert [value for row in z for value in row] == pytest.approx(stored["neurons"][:whole_rows * 32], rel=1e-6)


def compared_rows_are_the_stores(app, recording, shown, sides):
    aggregation, sample = parse_aggregation(shown["aggregation"])
    for side, trial in sides:
        (row,) = store_rows(recording, trial, training_step=int(shown["training_step"]), node=shown["node"],
                            role=shown["role"], kind=shown["kind"], iteration=int(shown["iteration"]),
                            aggregation=aggregation, sample=sample)
        cell = app.page.locator(f"#compare-table [data-side='{side}'][data-stat='mean']")
        assert float(cell.get_attribute("data-value")) == row["mean"]


def test_compare_the_shown_tensor_with_itself_in_another_trial(app, recording):
    """Nothing pinned: the shown tensor is pinned, and compared with itself in the trial chosen (issue 33, item 10)."""
    shown = app.read()
    app.page.get_by_role("tab", name="Compare").click()
    choose_option(app.page, "compare-trial", FIXED)
    expect(app.page.locator("#compare-table [data-side='pinned'][data-field='trial']")).to_have_text(BUGGED, timeout=SLOW)
    expect(app.page.locator("#compare-table [data-side='shown'][data-field='trial']")).to_have_text(FIXED, timeout=SLOW)
    expect(app.page.locator("#compare-table thead")).to_contain_text("Compared − pinned")
    compared_rows_are_the_stores(app, recording, shown, (("pinned", BUGGED), ("shown", FIXED)))
    assert not app.errors


def test_choosing_a_trial_keeps_the_pinned_side_and_one_click_compares_with_the_other_trial(app, recording):
    shown = app.read()
    app.page.get_by_role("tab", name="Compare").click()
    app.page.click("#compare-pin")
    pinned_trial = app.page.locator("#compare-table [data-side='pinned'][data-field='trial']")
    expect(pinned_trial).to_have_text(BUGGED, timeout=SLOW)
    pinned_step = app.page.locator("#compare-table [data-side='pinned'][data-field='training_step']").inner_text()
    choose_option(app.page, "compare-trial", FIXED)  # the pinned side stays what was pinned
    expect(app.page.locator("#compare-table [data-side='shown'][data-field='trial']")).to_have_text(FIXED, timeout=SLOW)
    expect(pinned_trial).to_have_text(BUGGED)
    assert app.page.locator("#compare-table [data-side='pinned'][data-field='training_step']").inner_text() == pinned_step
    compared_rows_are_the_stores(app, recording, shown, (("pinned", BUGGED), ("shown", FIXED)))

    app.page.click("#compare-clear")
    expect(app.page.locator("#compare-table")).to_have_count(0, timeout=SLOW)
    button = app.page.locator("#compare-other-trial")  # two trials in the group: one click
    expect(button).to_have_text(f"Compare with the other trial ({FIXED})", timeout=SLOW)
    button.click()
    expect(pinned_trial).to_have_text(BUGGED, timeout=SLOW)
    expect(app.page.locator("#compare-table [data-side='shown'][data-field='trial']")).to_have_text(FIXED, timeout=SLOW)
    for field in ("training_step", "node_id", "role", "iteration"):  # same node, same step
        sides = app.page.locator(f"#compare-table [data-field='{field}']")
        assert sides.nth(0).inner_text() == sides.nth(1).inner_text()
    compared_rows_are_the_stores(app, recording, shown, (("pinned", BUGGED), ("shown", FIXED)))
    assert not app.errors


def test_the_samples_csv_is_the_table_as_shown_at_full_precision_and_named_after_it(app, recording):
    import csv
    import io

    shown = app.read()
    app.page.get_by_role("tab", name="Samples").click()
    app.page.click("#samples-add-selected")
    header = app.page.locator("#samples-table th.dash-header", has_text=shown["node"])
    expect(header.first).to_be_visible(timeout=SLOW)
    button = app.page.locator("#samples-csv")
    expect(button).to_have_class("btn btn-outline-secondary btn-sm")  # styled as the other tabs' buttons
    with app.page.expect_download() as download:
        button.click()
    name = download.value.suggested_filename
    assert name == f"comgra-samples-{shown['trial']}-step{shown['training_step']}-iteration{shown['iteration']}.csv"
    rows = list(csv.reader(io.StringIO(Path(download.value.path()).read_text())))
    assert rows[0][0] == "sample" and any(shown["node"] in title for title in rows[0])
    column = next(i for i, title in enumerate(rows[0]) if shown["node"] in title)
    for row in rows[1:]:
        (stored,) = store_rows(recording, shown["trial"], training_step=int(shown["training_step"]),
                               node=shown["node"], role=shown["role"], kind=shown["kind"],
                               iteration=int(shown["iteration"]), aggregation="sample", sample=int(row[0]))
        assert float(row[column]) == stored["mean"]  # full precision: the float32 the store holds, exactly
    assert not app.errors

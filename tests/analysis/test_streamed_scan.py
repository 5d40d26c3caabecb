"""A trial too big to hold is streamed node group by node group, each group a window of steps at a time: the
rows held at once stay under the budget however many steps were recorded, and the findings are those of a
scan in memory."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from planted import InfiniteGradient, Network, mlp, record  # noqa: E402

from comgra.analysis import ScanOptions, Scanner, detectors, document, loading, streaming  # noqa: E402
from comgra.store import GroupReader  # noqa: E402
from comgra.store import layout

BUDGET = 800  # rows: a few steps' worth of these small networks


def _nan_at_step_9(step, name, h):
    if step == 9 and name == "layer1":
        h = h.clone()
        h[3, 0] = float("nan")
    return h


def _networks() -> dict[str, Network]:
    """Planted faults of ``test_planted_faults``, a few of each kind of detector: per node, across nodes."""
    dead = mlp(4, 16, 1, activation=nn.ReLU)
    with torch.no_grad():
        dead[0][1][0].bias.fill_(-20.0)
    return {
        "nan": Network(mlp(4, 8, 8, 8, 1), steps=16, inject=_nan_at_step_9),
        "inf_gradient": Network(mlp(4, 8, 8, 8, 1), steps=14, lr=0.0, after=lambda step, name, h: (
            InfiniteGradient.apply(h) if step == 9 and name == "layer1" else h)),
        "dead": Network(dead, steps=30),
        "deep": Network(mlp(16, *[16] * 8, 1, activation=nn.Sigmoid), inputs=16, steps=14, lr=0.01),
        "one_sided": Network(mlp(4, 16, 3, last=nn.LeakyReLU(0.01)), steps=24, output=torch.sigmoid,
                             target=lambda x: (x[:, :3] > 0).float()),
    }


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("streamed")
    for trial, network in _networks().items():
        group = record(root, trial, network)
    return group


def _json(result) -> list[str]:
    return [json.dumps(f, sort_keys=True) for f in document(result.findings)["findings"]]


def _streamed_detectors_only(monkeypatch, scan):
    """A scan in memory by the detectors a streamed scan runs too (the training-bug detectors read the whole trial
    at once and run in memory only)."""
    with monkeypatch.context() as patch:
        patch.setattr(detectors, "DETECTORS", {name: detectors.DETECTORS[name] for name in detectors.STREAMED})
        return scan()


def _without_hints(result):
    result.findings = [f for f in result.findings if f.detector != "correlation"]
    return result


def _streamed(monkeypatch, budget: int) -> list[int]:
    held: list[int] = []
    monkeypatch.setattr(loading, "observe_rows", held.append)
    monkeypatch.setattr(loading, "IN_MEMORY_ROWS", budget)
    monkeypatch.setattr(streaming, "GROUP_ROWS", budget)
    return held


def test_a_streamed_scan_holds_a_bounded_number_of_rows_and_finds_what_a_scan_in_memory_finds(
        recorded, monkeypatch) -> None:
    in_memory = _streamed_detectors_only(monkeypatch, lambda: Scanner().scan(recorded))
    held = _streamed(monkeypatch, BUDGET)
    monkeypatch.setattr(streaming, "CORRELATION_ROWS", 10**9)  # every sample, as in memory (subsampling: below)
    streamed = Scanner().scan(recorded)
    largest_trial = max(loading.recorded_rows(GroupReader(recorded).trial(t)) for t in _networks())
    assert largest_trial > 4 * BUDGET  # the recordings are big enough to need several groups
    # A batch of windows may pass the budget by one window, never by much and never near the trial.
    assert held and max(held) <= 2 * BUDGET < largest_trial
    assert _json(streamed) == _json(in_memory)
    detectors = {f.detector for f in streamed.findings}
    assert {"non_finite", "dead_units", "one_sided", "vanishing_gradient"} <= detectors


def _largest_node(group, trial: str) -> int:
    """The rows of the biggest node (per-sample gradients left out, as the scan leaves them out): a group
    holds at least one node's rows of the whole run."""
    import pyarrow as pa
    import pyarrow.compute as pc

    reader = GroupReader(group).trial(trial)
    table = pa.concat_tables([reader.read_tensor_chunk(p, ["node", "kind", "aggregation"])
                              for p in reader.tensor_chunks()])
    table = table.filter(pc.invert(pc.and_(pc.equal(table["kind"], "gradients"),
                                           pc.equal(table["aggregation"], "sample"))))
    return max(table.group_by("node").aggregate([("node", "count")])["node_count"].to_pylist())


def test_rows_held_stay_under_a_budget_that_does_not_grow_with_the_steps(tmp_path, monkeypatch) -> None:
    """Eight times the steps: the rows held at once stay under the same budget, though one node's rows over the
    long run are several times that budget (a node's run is read a window of steps at a time)."""
    short = record(tmp_path / "short", "run", Network(mlp(4, 8, 8, 1), steps=20))
    long = record(tmp_path / "long", "run", Network(mlp(4, 8, 8, 1), steps=160))
    budget = BUDGET // 2  # a node of the long run holds several times this many rows
    largest = {}
    for name, group in (("short", short), ("long", long)):
        held = _streamed(monkeypatch, budget)
        streamed = Scanner().scan(group)
        rows = loading.recorded_rows(GroupReader(group).trial("run"))
        assert rows > 3 * budget
        largest[name] = max(held)
        assert max(held) <= 2 * budget
        monkeypatch.setattr(loading, "observe_rows", None)
        monkeypatch.setattr(loading, "IN_MEMORY_ROWS", 10**9)
        in_memory = _streamed_detectors_only(monkeypatch, lambda: Scanner().scan(group))
        # What a scan in memory finds (the correlation hints saw a subsample of the steps: the test below).
        assert _json(_without_hints(streamed)) == _json(_without_hints(in_memory))
    assert _largest_node(long, "run") > 4 * budget  # the old bound (a node's whole run) would be far above
    assert largest["long"] <= 2 * budget


def test_the_correlation_hints_of_a_streamed_scan_name_their_subsample(tmp_path, monkeypatch) -> None:
    noise = torch.Generator().manual_seed(7)

    def register_difficulty(recorder, x):
        recorder.register_tensor("difficulty", x[:, 2:3] + 0.3 * torch.randn(x.shape[0], 1, generator=noise))

    group = record(tmp_path, "hint", Network(mlp(4, 8, 1), steps=40, extra=register_difficulty))
    _streamed(monkeypatch, BUDGET)
    monkeypatch.setattr(streaming, "CORRELATION_ROWS", 400)
    hints = [f for f in Scanner().scan(group, options=ScanOptions(target="difficulty")).findings
             if f.detector == "correlation"]
    assert hints and all("recorded step only, a subsample that keeps the scan's memory bounded (400 per-sample"
                         in f.message for f in hints)
    top = hints[0]
    assert (top.node, top.evidence["feature"]) == ("input", "input[2]") and top.evidence["spearman"] > 0.8
    assert top.evidence["samples"] < 40 * 8 / 2  # a subsample of the steps


def test_a_streamed_scan_reads_chunks_without_duckdb_and_still_lists_a_damaged_one(tmp_path, monkeypatch) -> None:
    """DuckDB keeps the Parquet footer of every file it read for as long as the reader lives (about 400 MiB
    per trial of a long recording): a streamed scan reads the chunks itself; the reader sees only one it
    cannot open, and lists it."""
    from comgra.store import format as fmt
    from comgra.store.reader import TrialReader

    group = record(tmp_path, "dead", _networks()["dead"])
    damaged = layout.rank_dir(fmt.trial_dir(group, "dead"), "tensors", 0) / fmt.chunk_name(50, 100, 100)
    damaged.write_bytes(b"not parquet at all")
    through_reader: list[str] = []
    read_tensor_chunk = TrialReader.read_tensor_chunk

    def counted(self, path, columns=None):
        through_reader.append(path.name)
        return read_tensor_chunk(self, path, columns)

    monkeypatch.setattr(TrialReader, "read_tensor_chunk", counted)
    _streamed(monkeypatch, BUDGET)
    result = Scanner().scan(group)
    assert set(through_reader) <= {damaged.name}  # the intact chunks never go through the reader's DuckDB
    assert [line for line in result.problems if damaged.name in line and "damaged" in line]
    assert any(f.detector == "dead_units" for f in result.findings)

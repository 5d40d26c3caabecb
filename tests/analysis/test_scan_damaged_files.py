"""``comgra scan`` over damaged recordings (issue 21, items 9 and 10): it reports what it could not read,
answers the same in every run, and names no origin it cannot know."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from comgra.store import GroupReader
from comgra.store import format as fmt
from comgra.store import layout

torch = pytest.importorskip("torch")

GROUP, TRIAL = "group", "trial"
NAN_STEP = 2


def record_with_nan(root: Path) -> Path:
    """Four steps of a tiny model; at step 2 the input holds a NaN, which spreads to every node after it."""
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    generator = torch.Generator().manual_seed(3)
    recorder = ComgraRecorder(root, GROUP, TRIAL, DecisionMakerForRecordingsHardcoded({0, 1, 2, 3}),
                              flush_seconds=60.0)
    recorder.track_module("model", model)
    for step in range(4):
        recorder.start_batch(step, 3)
        recorder.start_iteration()
        x = torch.randn(3, 3, generator=generator)
        if step == NAN_STEP:
            x[0, 0] = float("nan")
        recorder.register_tensor("x", x, is_input=True)
        hidden = torch.tanh(model[0](x))
        recorder.register_tensor("hidden", hidden)
        y = model[2](hidden)
        recorder.register_tensor("y", y)
        loss = y.pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    return root / GROUP


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    durable, fmt.DURABLE_WRITES = fmt.DURABLE_WRITES, False
    try:
        return record_with_nan(tmp_path_factory.mktemp("nan"))
    finally:
        fmt.DURABLE_WRITES = durable


def copy_of(recorded: Path, folder: Path) -> Path:
    shutil.copytree(recorded, folder / GROUP)
    return folder / GROUP


def scan_in_a_process(group: Path, hash_seed: int) -> subprocess.CompletedProcess[str]:
    """``comgra scan --json`` in a process of its own, with its own string hashing (set order)."""
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    code = "import sys; from comgra.cli.app import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "scan", "--path", str(group), "--json"],
                          capture_output=True, text=True, env=env, timeout=300)


def graph_path(group: Path) -> Path:
    trial = GroupReader(group).trial(TRIAL)
    (graph_hash,) = set(trial.steps()["graph"].to_pylist())
    return fmt.trial_dir(group, TRIAL) / "graphs" / f"{graph_hash}.json"


def test_an_intact_recording_names_the_origin(recorded: Path, tmp_path: Path) -> None:
    """The baseline: with its graph, the scan names the input as where the NaN starts."""
    answer = scan_in_a_process(copy_of(recorded, tmp_path), 0)
    assert answer.returncode == 0, answer.stderr
    document = json.loads(answer.stdout)
    (origin,) = [f for f in document["findings"] if f["detector"] == "non_finite" and "starts at" in f["message"]]
    assert origin["node"] == "x" and origin["training_step"] == NAN_STEP


@pytest.mark.parametrize("damage", ["not json", "deleted", "fifo"])
def test_an_unreadable_graph_is_reported_and_no_origin_is_guessed_the_same_in_every_run(
        recorded: Path, tmp_path: Path, damage: str) -> None:
    outputs = []
    for seed in (1, 2, 3, 4):
        group = copy_of(recorded, tmp_path / str(seed))  # a fresh copy: no findings saved by an earlier run
        path = graph_path(group)
        if damage == "not json":
            path.write_text("{nodes: [")
        elif damage == "deleted":
            path.unlink()
        else:
            path.unlink()
            os.mkfifo(path)
        answer = scan_in_a_process(group, seed)
        assert answer.returncode == 0, answer.stderr
        outputs.append(answer.stdout.replace(str(group), "GROUP"))
    assert len(set(outputs)) == 1, "the scan answered differently from run to run"
    document = json.loads(outputs[0])
    assert any(f"graphs/{path.name}" in p for p in document["skipped_chunks"]), document["skipped_chunks"]
    non_finite = [f for f in document["findings"] if f["detector"] == "non_finite"]
    assert non_finite, "the NaN itself is still found"
    for finding in non_finite:
        assert "starts at" not in finding["message"] and "spread here from" not in finding["message"]
        assert finding["evidence"].get("origin_unknown") is True, finding["message"]
        assert "not known" in finding["message"]


def _retype_mean(group: Path) -> Path:
    (path,) = fmt.chunk_files(layout.rank_dir(fmt.trial_dir(group, TRIAL), "tensors", 0))
    data = pq.read_table(path)
    index = data.schema.get_field_index("mean")
    pq.write_table(data.set_column(index, pa.field("mean", pa.string()),
                                   pa.array([str(v) for v in data["mean"].to_pylist()])), path)
    return path


def test_a_retyped_chunk_is_reported_by_scan_not_a_crash(recorded: Path, tmp_path: Path) -> None:
    group = copy_of(recorded, tmp_path)
    bad = _retype_mean(group)
    answer = scan_in_a_process(group, 0)
    assert answer.returncode == 0, answer.stderr
    assert "ArrowInvalid" not in answer.stderr + answer.stdout
    document = json.loads(answer.stdout)
    assert any(bad.name in p and "not a chunk of this table" in p for p in document["skipped_chunks"])


def test_a_retyped_chunk_is_reported_by_the_streamed_scan(recorded: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial too big for memory is streamed: its chunks are read by pyarrow directly, and checked too."""
    from comgra.analysis import Scanner, loading

    group = copy_of(recorded, tmp_path)
    bad = _retype_mean(group)
    monkeypatch.setattr(loading, "IN_MEMORY_ROWS", 0)
    result = Scanner().scan(group)
    assert any(bad.name in p for p in result.problems), result.problems
    assert not [f for f in result.findings if f.detector == "non_finite"]  # its values were never read

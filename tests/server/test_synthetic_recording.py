"""The app benchmark's recordings (benchmarks/synthetic_recording.py) are what one writer process leaves,
however they are written."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from comgra.store import GroupReader


def _chunks(group: Path) -> dict[str, Path]:
    return {str(p.relative_to(group)): p for p in sorted(group.rglob("*.parquet"))}


def test_trials_written_in_two_processes_are_the_files_one_process_writes(tmp_path, synthetic):
    """Same chunk names (so the same flushes and merges) and the same rows in each chunk."""
    options = dict(scale=0.15, nodes=40, steps_per_chunk=2, distinct_steps=3)
    one = synthetic.write_recording(tmp_path / "one", synthetic.Options(**options))
    two = synthetic.write_recording(tmp_path / "two", synthetic.Options(**options, jobs=2))
    chunks_one, chunks_two = _chunks(one), _chunks(two)
    assert chunks_one.keys() == chunks_two.keys()
    assert any("-l1" in name for name in chunks_one)  # 36 steps in chunks of 2: the writer merged 16 of them
    for name, path in chunks_one.items():
        if "/tensors/" in name:
            assert pq.read_table(path).equals(pq.read_table(chunks_two[name])), name


def test_a_repeated_step_holds_the_values_of_the_step_it_repeats(tmp_path, synthetic):
    """The same values per tensor, but its recorded samples in an order of their own (S, issue 8: steps that
    paired the samples of every tensor alike gave the scan correlation hints at +-1.00)."""
    group = synthetic.write_recording(tmp_path, synthetic.Options(scale=0.05, nodes=40, trials=1, distinct_steps=2))
    trial = GroupReader(group).trial(GroupReader(group).trials()[0])
    steps = sorted(set(trial.steps().column("training_step").to_pylist()))
    columns = ["node", "role", "kind", "iteration", "aggregation", "sample", "mean", "max", "neurons"]
    tables = [trial.selection(training_step=s).select(columns).to_pylist() for s in steps[:5]]

    def values(rows, with_sample):
        return sorted(repr({k: v for k, v in row.items() if with_sample or k != "sample"}) for row in rows)

    rows = [values(table, with_sample=False) for table in tables]
    assert rows[2] == rows[0] and rows[3] == rows[1] and rows[4] == rows[0] and rows[0] != rows[1]
    assert values(tables[2], with_sample=True) != values(tables[0], with_sample=True)
    aggregated = [[row for row in values(table, with_sample=True) if "'sample': -1" in row] for table in tables]
    assert aggregated[2] == aggregated[0] and aggregated[0]


def test_presorted_chunks_are_the_files_the_writer_writes(tmp_path, synthetic, monkeypatch):
    """Chunks of repeated steps written without the writer's sort (PresortedChunks) are byte for byte the
    chunks the writer writes from the unsorted rows, under the same names, beside the writer's own chunks."""
    written = []
    original = synthetic.PresortedChunks.write
    monkeypatch.setattr(synthetic.PresortedChunks, "write",
                        lambda self, start: (written.append(start), original(self, start))[1])
    # 3 distinct steps in chunks of 4: chunks start 1, 2 and 0 steps past a multiple of 3 (three templates);
    # 37 steps end in a partial chunk, which the writer writes; max_merged_rows so small that nothing merges.
    options = dict(scale=37 / 240, nodes=40, trials=1, steps_per_chunk=4, distinct_steps=3, max_merged_rows=100)
    plain = synthetic.write_recording(tmp_path / "plain", synthetic.Options(**options, presorted=False))
    assert written == []
    fast = synthetic.write_recording(tmp_path / "fast", synthetic.Options(**options))
    assert written == list(range(4, 36, 4))
    chunks_plain, chunks_fast = _chunks(plain), _chunks(fast)
    assert chunks_plain.keys() == chunks_fast.keys()
    tensors = [name for name in chunks_plain if name.startswith("tensors/") or "/tensors/" in name]  # format 3 or 2
    assert len(tensors) == 10
    for name in tensors:
        assert chunks_plain[name].read_bytes() == chunks_fast[name].read_bytes(), name

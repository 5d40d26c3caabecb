"""What the reader keeps of its chunk checks stays within what is on disk (issue 31 item 13): a live writer
merges every flush's chunks away, and a server that kept the checks of 4,096 vanished chunk versions grew for
the first hours of a run."""
from __future__ import annotations

import shutil
from pathlib import Path

from comgra.store import chunk_checks
from comgra.store import format as fmt
from comgra.store import layout


def test_the_checks_of_chunks_merged_away_are_let_go(fresh_recording: Path, tmp_path: Path) -> None:
    (trial,) = (fresh_recording / "trials").iterdir()
    original = fmt.chunk_files(layout.rank_dir(trial, "tensors", 0))[0]
    checks = chunk_checks.ChunkChecks()
    folder = tmp_path / "tensors"
    folder.mkdir()
    previous = None
    for version in range(400):  # each flush: a new chunk, the one before merged away
        chunk = folder / f"chunk-{version}.parquet"
        shutil.copy(original, chunk)
        checks.verify("tensors", chunk, frozenset({"training_step", "mean"}), lambda count: list(range(count)),
                      rank_optional=True)  # format 3: the rank is the folder's (rank=<r>)
        if previous is not None:
            previous.unlink()
        previous = chunk
    assert len(checks._checked) <= 2 * 1 + chunk_checks.CHECKED_PRUNE_AT_LEAST + 1, len(checks._checked)

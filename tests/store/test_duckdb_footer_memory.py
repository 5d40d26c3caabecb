"""What a reader's DuckDB keeps of chunks merged away stays bounded (issue 31 item 13): DuckDB's Parquet footer
cache keeps every file's parsed footer, by path, and lets go of none, so a server reading a live run (whose
writer merges its chunks into new files) grew with every chunk it had read, for as long as it ran."""
from __future__ import annotations

import ctypes
import gc
from pathlib import Path

import pytest

from comgra.store import format as fmt
from comgra.store import layout
from comgra.store.reader import GroupReader


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _malloc_in_use_mib() -> float:
    """glibc's memory in use (mallinfo2: every arena, and the blocks it mapped on its own)."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        pytest.skip("needs glibc 2.33 or later (mallinfo2)")
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20


def test_duckdb_keeps_a_bounded_share_of_chunks_merged_away(fresh_recording: Path) -> None:
    group = GroupReader(fresh_recording)
    (trial_id,) = group.trials()
    trial = group.trial(trial_id)
    folder = layout.rank_dir(trial.directory, "tensors", 0)
    chunk = fmt.chunk_files(folder)[0]
    parsed = fmt.parse_chunk_name(chunk.name)
    step = parsed.first
    expected = trial.selection(training_step=step).sort_by([("node", "ascending"), ("role", "ascending")])
    footer = chunk.stat().st_size  # an upper bound of the footer's size: the test needs its order only
    gc.collect()
    before = _malloc_in_use_mib()
    renames = 600
    for version in range(renames):  # a writer's merge: the rows move to a new file, the old one is gone
        moved = folder / fmt.chunk_name(10_000 + version, parsed.first, parsed.last, 0)
        chunk.rename(moved)
        chunk = moved
        assert trial.selection(training_step=step).num_rows == expected.num_rows
    gc.collect()
    grown = _malloc_in_use_mib() - before
    answer = trial.selection(training_step=step).sort_by([("node", "ascending"), ("role", "ascending")])
    assert answer.equals(expected)
    # Before: DuckDB's cache held every renamed chunk's parsed footer (about 60 KiB each here: +36 MiB; now under 6).
    assert grown < 12, f"{grown:.1f} MiB more in use after {renames} chunks merged away (chunk: {footer} bytes)"


def test_the_readers_duckdb_hands_freed_memory_back_after_small_queries(fresh_recording: Path) -> None:
    """DuckDB's allocator keeps what a query freed until the query's peak passes its flush threshold (128 MiB by
    default): a server answering many small queries kept it. The reader's connection flushes past 4 MB."""
    group = GroupReader(fresh_recording)
    (trial_id,) = group.trials()
    trial = group.trial(trial_id)
    trial.selection(training_step=fmt.parse_chunk_name(
        fmt.chunk_files(layout.rank_dir(trial.directory, "tensors", 0))[0].name).first)
    connection = trial._duck.connection  # the connection that query opened
    assert connection is not None
    (threshold,) = connection.execute(
        "SELECT value FROM duckdb_settings() WHERE name = 'allocator_flush_threshold'").fetchone()
    assert threshold in ("4MB", "4.0 MB", "4000000B", "4194304B", "3.8 MiB", "4.0 MiB"), threshold


def _footer_cache_on(trial) -> bool:
    return bool(trial._duck.connection.execute("SELECT current_setting('parquet_metadata_cache')").fetchone()[0])


def test_duckdb_keeps_no_small_footer_and_caches_large_ones(fresh_recording: Path, monkeypatch) -> None:
    """A live run's chunks have small footers, cheap to parse again: DuckDB's footer cache stays off for them (it
    held every live chunk's footer, ten times its size, and grew with the run); a chunk with a footer of at least
    ``CACHE_FOOTERS_FROM_BYTES`` turns it on, for that reader's later connections too."""
    from comgra.store import duck_connection

    group = GroupReader(fresh_recording)
    (trial_id,) = group.trials()
    trial = group.trial(trial_id)
    chunks = fmt.chunk_files(layout.rank_dir(trial.directory, "tensors", 0))
    assert max(duck_connection.footer_bytes(str(c)) for c in chunks) < duck_connection.CACHE_FOOTERS_FROM_BYTES
    step = fmt.parse_chunk_name(chunks[0].name).first
    expected = trial.selection(training_step=step)
    assert not _footer_cache_on(trial) and expected.num_rows
    monkeypatch.setattr(duck_connection, "CACHE_FOOTERS_FROM_BYTES", 1)  # every footer counts as large now
    fresh = GroupReader(fresh_recording).trial(trial_id)
    assert fresh.selection(training_step=step).equals(expected) and _footer_cache_on(fresh)
    fresh._duck._connection = None  # let go, as past the budget of chunks gone: the next one caches from the start
    assert fresh.selection(training_step=step).equals(expected) and _footer_cache_on(fresh)

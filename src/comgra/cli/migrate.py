"""``comgra migrate GROUP`` and ``comgra compact GROUP``: bring a recording to format 3, one file per table and rank.

``migrate`` rewrites the trials of formats 1 and 2 as format 3 (store/migrate.py); ``compact`` does that too and
rewrites each finished format-3 trial into one Parquet file per table and rank (store/compaction.py), as the
writer does at ``finalize`` since format 3. Both print one line per trial, skip a trial that a live run is writing,
and are safe to interrupt: run them again to finish.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from comgra.store import format as fmt
from comgra.store.migrate import compact_group, migrate_group

DESCRIPTIONS = {
    "migrate": "Rewrite the trials of a group recorded in format 1 or 2 as format 3 (one Hive-partitioned Parquet "
               "dataset per table, GROUP/<table>/trial=<id>/rank=<r>/), safely: an interrupted run leaves every "
               "trial readable; run it again to finish.",
    "compact": "Rewrite each finished trial of a group into one Parquet file per table and rank (more only past "
               "about 128 MiB); trials of format 1 or 2 are migrated to format 3 on the way.",
}


def main(command: str, arguments: Sequence[str]) -> list[str]:
    """The lines to print for ``comgra migrate|compact ARGUMENTS``; ValueError names a path without a recording."""
    parser = argparse.ArgumentParser(prog=f"comgra {command}", description=DESCRIPTIONS[command])
    parser.add_argument("path", type=Path, help="a group folder (comgra_root_path/group)")
    path = parser.parse_args(list(arguments)).path.expanduser().resolve()
    if not (path / fmt.TRIALS_DIR).is_dir():
        raise ValueError(f"{str(path)!r} holds no comgra recording; pass a group folder (comgra_root_path/group), "
                         f"the folder that holds {fmt.TRIALS_DIR}/.")
    reports = (migrate_group if command == "migrate" else compact_group)(path)
    return [f"comgra {command}: {report.describe()}" for report in reports] or [f"comgra {command}: no trials found"]

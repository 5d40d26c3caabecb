"""``comgra repair PATH``: make a closed or crashed recording exact for plain Parquet readers.

PATH is a group folder (the parent of ``trials/``) or one trial folder. Prints one line per trial
and exits 0; a trial that a live run is writing is reported as skipped and left alone.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from comgra.store import format as fmt
from comgra.store.repair import TrialRepair, repair_group, repair_trial


def repair_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="comgra repair", description="Remove what a crashed run left (temporary files, chunks already merged "
        "into another) so that plain readers of GROUP/<table>/ (format 3; trials/<id>/<table>/ before) see every row "
        "exactly once.")
    parser.add_argument("path", type=Path, help="a group folder (comgra_root_path/group) or one trial folder")
    return parser


def run_repair(path: Path) -> list[TrialRepair]:
    """The repairs done under ``path``; raises ValueError naming the path when it holds no recording."""
    path = path.expanduser().resolve()
    if (path / fmt.TRIALS_DIR).is_dir():
        return repair_group(path)
    if (path / fmt.TRIAL_META).is_file() or any((path / table).is_dir() for table in fmt.TABLES):
        return [repair_trial(path)]
    raise ValueError(f"{str(path)!r} holds no comgra recording; pass a group folder (comgra_root_path/group) "
                     "or a trial folder (GROUP/trials/<trial_id>).")


def main(arguments: Sequence[str]) -> list[str]:
    """The lines to print for ``comgra repair ARGUMENTS``."""
    repairs = run_repair(repair_parser().parse_args(list(arguments)).path)
    return [f"comgra repair: {repair.describe()}" for repair in repairs] or ["comgra repair: no trials found"]

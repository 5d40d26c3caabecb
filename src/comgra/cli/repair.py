"""``comgra repair PATH``: make a closed or crashed recording exact for plain Parquet readers.

PATH is a group folder (the parent of ``trials/``) or one trial folder. Prints one line per trial
and exits 0; a trial that a live run is writing is reported as skipped and left alone.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from typing import TYPE_CHECKING

from comgra.cli.arguments import add_path, chosen_path

if TYPE_CHECKING:
    from comgra.store.repair import TrialRepair


def repair_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="comgra repair", description="Remove what a crashed run left (temporary files, chunks already merged "
        "into another) so that plain readers of GROUP/<table>/ (format 3; trials/<id>/<table>/ before) see every row "
        "exactly once.")
    add_path(parser, "a group folder (comgra_root_path/group) or one trial folder, or a group's URL (s3://...)")
    return parser


def run_repair(path: Path | str) -> list[TrialRepair]:
    """The repairs done under ``path``; raises ValueError naming the path when it holds no recording."""
    if isinstance(path, str):  # a group's URL: repaired in a mirror, what repair removes deleted in the store
        from comgra.errors import ComgraError
        from comgra.store.remote import repair_remote
        try:
            return repair_remote(path)
        except ComgraError as error:
            raise ValueError(str(error)) from None
    if not path.exists():
        raise ValueError(f"the path {str(path)!r} does not exist; pass a group folder (comgra_root_path/group) "
                         "or a trial folder (GROUP/trials/<trial_id>).")
    from comgra.store import format as fmt  # pyarrow: not before the arguments are read
    from comgra.store.repair import repair_group, repair_trial

    path = path.expanduser().resolve()
    if (path / fmt.TRIALS_DIR).is_dir():
        return repair_group(path)
    if (path / fmt.TRIAL_META).is_file() or any((path / table).is_dir() for table in fmt.TABLES):
        return [repair_trial(path)]
    raise ValueError(f"{str(path)!r} holds no comgra recording; pass a group folder (comgra_root_path/group) "
                     "or a trial folder (GROUP/trials/<trial_id>).")


def main(arguments: Sequence[str]) -> list[str]:
    """The lines to print for ``comgra repair ARGUMENTS``."""
    path = chosen_path(repair_parser().parse_args(list(arguments)))
    assert path is not None  # required
    repairs = run_repair(path)
    return [f"comgra repair: {repair.describe()}" for repair in repairs] or ["comgra repair: no trials found"]

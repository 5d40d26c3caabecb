"""What the command line gives, checked: shared by the subcommands (``app``, ``scan``, ``test_run``), which
import this module and never each other. A bad value raises ``UsageError``, printed as one line, exit 2.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

USAGE_ERROR = 2


class UsageError(Exception):
    """A problem with the command line; its message is printed as it is."""


def positive_int(text: str) -> int:
    """A number of steps: an int of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of steps; try e.g. 2000")
    return value


def check_recording(path: Path) -> Path:
    """The group folder to serve; raises UsageError with a hint when ``path`` holds no recording."""
    path = path.expanduser().resolve()
    if not path.exists():
        raise UsageError(f"the path {str(path)!r} does not exist. Pass the group folder: comgra_root_path/group.")
    if not path.is_dir():
        raise UsageError(f"the path {str(path)!r} is a file, not a recording folder.")
    if (path / "trials").is_dir():
        return path
    groups = sorted(p.name for p in path.iterdir() if (p / "trials").is_dir())
    if groups:
        hint = " or ".join(repr(str(path / g)) for g in groups[:3])
        raise UsageError(f"{str(path)!r} is a root folder with groups; pass a group folder: {hint}.")
    if (path / "trials").exists() or path.name == "trials":
        raise UsageError(f"pass the group folder, the parent of {str(path)!r}.")
    raise UsageError(f"{str(path)!r} holds no comgra recording (no 'trials' folder). "
                     "Pass the group folder: comgra_root_path/group.")


def drop_recording_paths() -> list[str]:
    """Take off ``sys.path`` every folder that lies inside a recording (the working directory that ``python -m``
    or ``PYTHONPATH=.`` put there, run from a downloaded recording), so that no module comgra imports later
    (pandas, rich, a detector) can be a file that came with the recording; returns what was removed."""
    from comgra.config import recording_around

    removed = [entry for entry in sys.path if recording_around(entry or os.getcwd()) is not None]
    sys.path[:] = [entry for entry in sys.path if entry not in removed]
    return removed

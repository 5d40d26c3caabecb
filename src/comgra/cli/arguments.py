"""What the command line gives, checked: shared by the subcommands (``app``, ``scan``, ``test_run``), which
import this module and never each other. A bad value raises ``UsageError``, printed as one line, exit 2.
"""
from __future__ import annotations

import argparse
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


def add_path(parser: argparse.ArgumentParser, help: str, *, required: bool = True) -> None:
    """The path as a positional argument (``comgra scan ROOT/GROUP``), ``--path`` still accepted."""
    parser.add_argument("path", type=Path, nargs="?", help=help)
    parser.add_argument("--path", type=Path, dest="path_option", metavar="PATH", help="the same, as an option")
    parser.set_defaults(_path_required=required)


def chosen_path(args: argparse.Namespace) -> Path | None:
    """The path of ``add_path``, given positionally or as ``--path``; a UsageError when both differ or, where
    required, when neither is given."""
    positional, option = args.path, args.path_option
    if positional is not None and option is not None and positional != option:
        raise UsageError(f"two paths, {str(positional)!r} and --path {str(option)!r}; give one.")
    path = positional if positional is not None else option
    if path is None and args._path_required:
        raise UsageError("the path of a recording is missing: give the group folder, e.g. 'runs/my_group' "
                         "(comgra_root_path/group).")
    return path

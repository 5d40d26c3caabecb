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


def recording_path(text: str) -> str | Path:
    """A ``--path``: a URL (s3://, gs://, az://, hdfs://, ...) as it is, a local path or file:// URL as a Path."""
    if ":" not in text:  # a plain local path: no need for the filesystem layer (and the store's imports) to say so
        return Path(text)
    from comgra.errors import ConfigError
    from comgra.store.filesystems import is_url, local_path

    try:
        return text if is_url(text) else local_path(text)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def check_recording(path: str | Path) -> Path | str:
    """The group folder to serve; raises UsageError with a hint when ``path`` holds no recording. A URL is
    returned as it is, once its group is found there (its readers mirror it: comgra.store.remote)."""
    if isinstance(path, str) and ":" in path:  # a URL (recording_path kept it as text): found through a mirror
        from comgra.store.filesystems import is_url

        if is_url(path):
            return _check_remote_recording(path)
    path = Path(path).expanduser().resolve()
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


def _check_remote_recording(path: str) -> str:
    from comgra.errors import ComgraError
    from comgra.store.remote import group_folder

    try:
        local, _ = group_folder(path)
    except ComgraError as error:
        raise UsageError(str(error)) from None
    if not (local / "trials").is_dir():
        raise UsageError(f"{path!r} holds no comgra recording (no 'trials' folder). Pass the group's URL: "
                         "<comgra_root_path URL>/group.")
    return str(path)


def drop_recording_paths() -> list[str]:
    """Take off ``sys.path`` every folder that lies inside a recording (the working directory that ``python -m``
    or ``PYTHONPATH=.`` put there, run from a downloaded recording), so that no module comgra imports later
    (pandas, rich, a detector) can be a file that came with the recording; returns what was removed."""
    from comgra.config import recording_around

    removed = [entry for entry in sys.path if recording_around(entry or os.getcwd()) is not None]
    sys.path[:] = [entry for entry in sys.path if entry not in removed]
    return removed


def add_path(parser: argparse.ArgumentParser, help: str, *, required: bool = True) -> None:
    """The path as a positional argument (``comgra scan ROOT/GROUP``), ``--path`` still accepted."""
    parser.add_argument("path", type=recording_path, nargs="?", help=help)
    parser.add_argument("--path", type=recording_path, dest="path_option", metavar="PATH", help="the same, as an option")
    parser.set_defaults(_path_required=required)


def chosen_path(args: argparse.Namespace) -> Path | str | None:
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

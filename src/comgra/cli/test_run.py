"""``comgra-test-run``: train the tutorial network and record it, to have data for the GUI.

Usage::

    comgra-test-run                      # into the user data folder, then: comgra --use-path-for-test-run
    comgra-test-run --path /tmp/demo     # into /tmp/demo/testcase_for_demonstration
    comgra-test-run --steps 2000         # a quicker, shorter run
"""
from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from comgra.cli.arguments import UsageError, add_path, chosen_path, positive_int
from comgra.cli.paths import DEFAULT_TEST_RUN_GROUP, default_test_run_path

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, run the tutorial, and say how to open the result."""
    args = _parser().parse_args(argv)
    try:
        args.path = chosen_path(args)
    except UsageError as error:
        print(f"comgra-test-run: error: {error}", file=sys.stderr)
        return 2
    try:
        # Imported late so that --help answers at once and a missing torch gets a clear message.
        from comgra.examples.tutorial import run_tutorial
    except ModuleNotFoundError as error:
        if error.name != "torch":
            raise
        print("comgra-test-run needs PyTorch: pip install 'comgra[torch]'", file=sys.stderr)
        return 1
    root = args.path if args.path is not None else default_test_run_path()
    print(f"Recording {args.steps} steps per trial into {root / args.group}", file=sys.stderr)
    group_folder = run_tutorial(root, args.group, steps=args.steps)
    is_default_location = args.path is None and args.group == DEFAULT_TEST_RUN_GROUP
    print(_how_to_open(group_folder, is_default_location=is_default_location))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="comgra-test-run",
        description="Train the tutorial network (two trials, one with a bug) and record it with comgra.",
    )
    add_path(parser, f"root folder of the recording (default: {default_test_run_path()})", required=False)
    parser.add_argument(
        "--group",
        default=DEFAULT_TEST_RUN_GROUP,
        help=f"sub-folder for this group of trials (default: {DEFAULT_TEST_RUN_GROUP})",
    )
    parser.add_argument(
        "--steps", type=positive_int, default=20000, help="training steps per trial (default: 20000)"
    )
    return parser



def _how_to_open(group_folder: Path, *, is_default_location: bool) -> str:
    lines = [
        f"The recording is in {group_folder}",
        "Open it with:",
        f"  comgra {shlex.quote(str(group_folder))}",
    ]
    if is_default_location:
        lines.append("  comgra --use-path-for-test-run")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

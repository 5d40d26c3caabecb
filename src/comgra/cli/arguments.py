"""Argument types shared by the command-line entry points."""
from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """A number of steps: an int of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of steps; try e.g. 2000")
    return value

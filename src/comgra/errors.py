"""The exceptions comgra raises: one root, a few categories.

Every message names the offending value and says how to fix it.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class ComgraError(Exception):
    """Root of every error comgra raises on purpose."""


class RecordingError(ComgraError):
    """The recording API was called with a bad value or out of order."""


class ConfigError(ComgraError):
    """A constructor or command-line option has an invalid value."""


class StoreError(ComgraError):
    """A recording on disk is missing, corrupt, or of an unknown format."""


class SelectionError(StoreError):
    """A query asked for something the recording does not hold."""


def did_you_mean(value: str, known: Iterable[str]) -> str:
    """A deterministic suggestion plus the list of valid values, for error messages."""
    known = sorted(set(known))
    close = difflib.get_close_matches(value, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    shown = known if len(known) <= 12 else known[:12] + ["..."]
    return f"{hint} Known: {shown}"

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


# -- live control (breakpoints, run control) ---------------------------------------------------
class BreakpointError(ConfigError):
    """A breakpoint has an invalid field; ``field`` names it (``target``, ``condition``, ``enabled``, ...)."""

    def __init__(self, message: str, *, field: str = "condition"):
        super().__init__(message)
        self.field = field


class UnknownBreakpoint(BreakpointError):
    """No breakpoint has the given id."""

    def __init__(self, message: str):
        super().__init__(message, field="id")


class NotPaused(ComgraError):
    """A run-control command (continue, step, abort) was sent to a run that is not paused."""


class TrainingAborted(ComgraError):
    """Raised inside the training loop when the user aborts a run paused at a breakpoint."""


# -- the disk ----------------------------------------------------------------------------------
_FULL = ("ENOSPC", "EDQUOT")
_READ_ONLY = ("EROFS",)
_DENIED = ("EACCES", "EPERM")


def disk_problem(error: BaseException) -> str | None:
    """A full, read-only or unwritable disk in words (``the disk holding '/x' is full (...)``), for a message
    that names what happened instead of "an internal error"; None for any other error."""
    import errno
    import os

    if not isinstance(error, OSError):
        return None
    name = errno.errorcode.get(error.errno, "") if error.errno is not None else ""
    if not name:  # pyarrow's IOError carries the errno in its text only
        text = str(error)
        name = next((code for code in (*_FULL, *_READ_ONLY) if os.strerror(getattr(errno, code)) in text), "")
        if name:
            error = OSError(getattr(errno, name), os.strerror(getattr(errno, name)), error.filename)
    where = f" holding {str(error.filename)!r}" if error.filename else ""
    if name in _FULL:
        return f"the disk{where} is full ({error.strerror}); free some space"
    if name in _READ_ONLY:
        return f"the file system{where} is read-only ({error.strerror})"
    if name in _DENIED:
        return f"this user may not write there{' (' + repr(str(error.filename)) + ')' if error.filename else ''}: " \
               f"{error.strerror}"
    return None

"""Recorded text on a terminal: control characters shown, never obeyed.

A recording from someone else names its trials, nodes and modules as it likes, and those names reach
comgra's output (``comgra scan``, the CLI's messages, the server's log lines). An escape sequence in them
would clear the screen, retitle the window or rewrite earlier lines; a bidirectional override would make a
line read differently from what it says. ``printable`` writes each such character as a visible escape
(``\\x1b``, ``\\u202e``), keeping line breaks and tabs where asked; ``install`` does the same for the log
records and warnings a comgra command prints. (Rich markup is a separate matter: comgra's consoles print
recorded text with ``markup=False`` or as ``rich.text.Text``, and ``rich_escaped`` is for the one place that
renders markup, a progress bar's description.)
"""
from __future__ import annotations

import logging
import re
import sys
import warnings
from typing import Any

# C0 and C1 controls and DEL (category Cc), and the invisible format characters that reorder or hide text.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")
_KEEP_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, *, lines: bool = False) -> str:
    """``text`` with every control character written as a visible escape; ``lines=True`` keeps ``\\n`` and ``\\t``."""
    return (_KEEP_LINES if lines else _CONTROL).sub(_escape, str(text))


def rich_escaped(text: object) -> str:
    """For a Rich string that is rendered as markup: printable, and its ``[`` escaped."""
    from rich.markup import escape

    return escape(printable(text))


class _PrintableFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), lines=True)


_INSTALLED: list[bool] = []


def install() -> None:
    """In a comgra command's own process: its log records (``comgra.*``, Werkzeug's) and warnings reach the
    terminal with control characters escaped. Not for a user's training process, whose logging is theirs."""
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_PrintableFormatter("%(message)s"))
    handler.setLevel(logging.WARNING)
    for name in ("comgra", "werkzeug"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False
    shown = warnings.showwarning

    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        shown(printable(message, lines=True), category, filename, lineno, file, line)

    warnings.showwarning = show

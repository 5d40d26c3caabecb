"""HTML attributes that Dash accepts by pattern (``data-*``, ``aria-*``) but its typed signatures omit.

    >>> html.Div("x", **attributes({"data-node": "input", "aria-label": "input node"}))  # doctest: +SKIP
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    return dict(values)

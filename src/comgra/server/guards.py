"""How a callback fails: a ``ComgraError`` becomes its message in the page; anything else is comgra's own
fault, logged with its details for the terminal and worded as a plain sentence for the page."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from comgra.errors import ComgraError, disk_problem

log = logging.getLogger("comgra.server")

def raiser(error: Exception) -> Callable[[], Any]:
    """A builder that raises ``error`` (for ``guarded``, which words it for the page)."""
    def build() -> Any:
        raise error
    return build


def guarded(build: Callable[[], Any], on_error: Callable[[str], Any]) -> Any:
    """Run a builder; a failure becomes a message in the page instead of a broken callback."""
    try:
        return build()
    except ComgraError as error:
        return on_error(str(error))
    except Exception as error:
        if disk_problem(error):  # a full or read-only disk: what happened, not "an internal error"
            return on_error(f"comgra could not write: {disk_problem(error)}.")
        log.exception("comgra: a callback failed")  # the details for the terminal, a summary for the page
        return on_error(f"This could not be shown: {INTERNAL_ERROR}.")


INTERNAL_ERROR = "comgra hit an internal error (the terminal that runs the app shows the details)"

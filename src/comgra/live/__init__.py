"""The old import path of the breakpoints' control channel, kept for code written against it.

``comgra.live.control`` (documented in earlier READMEs) is ``comgra.breakpoints.control``, the same
module object, so that nothing written for one behaves differently under the other; the same for
``comgra.live.conditions``. New code imports ``comgra.breakpoints.control``. No torch.
"""
from __future__ import annotations

import sys

from comgra.breakpoints import conditions, control

sys.modules[f"{__name__}.control"] = control
sys.modules[f"{__name__}.conditions"] = conditions

__all__ = ["conditions", "control"]

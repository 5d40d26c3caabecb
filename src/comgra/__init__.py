"""comgra: computation graph analysis for PyTorch.

The conventional global recorder lives here, as in the original Comgra::

    import comgra
    from comgra.recorder import ComgraRecorder
    comgra.my_recorder = ComgraRecorder(...)

Importing comgra has no side effects and does not import torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from comgra._version import __version__
from comgra.errors import ComgraError, TrainingAborted

__all__ = ["ComgraError", "TrainingAborted", "__version__", "my_recorder"]

if TYPE_CHECKING:
    from comgra.recorder import ComgraRecorder

    my_recorder: ComgraRecorder
else:
    my_recorder: Any = None

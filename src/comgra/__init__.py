"""comgra: computation graph analysis for PyTorch.

The conventional global recorder lives here, as in the original Comgra::

    import comgra
    from comgra.recorder import ComgraRecorder
    comgra.my_recorder = ComgraRecorder(...)

and ``comgra.watch(model)``, which records every module's output without naming tensors by hand.

Importing comgra has no side effects and does not import torch.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from comgra._version import __version__
from comgra.errors import ComgraError, TrainingAborted

__all__ = ["ComgraError", "TrainingAborted", "__version__", "my_recorder", "watch"]

if TYPE_CHECKING:
    import torch

    from comgra.integrations.watch import Watch
    from comgra.recorder import ComgraRecorder

    my_recorder: ComgraRecorder
else:
    my_recorder: Any = None


def watch(model: torch.nn.Module, *, recorder: ComgraRecorder | None = None, name: str | None = None,
          include: str | Iterable[str] | None = None, exclude: str | Iterable[str] | None = None,
          max_depth: int | None = None, track_parameters: bool = True) -> Watch:
    """Record the output of every module of ``model`` under its dotted name, on the steps the recorder records.

    One line instead of a ``register_tensor`` call per tensor; the loop keeps its ``start_batch``,
    ``start_iteration``, ``record_current_gradients``, ``finish_iteration`` and ``finish_batch`` calls, and
    its own ``register_tensor`` calls go on working beside it. ``recorder``: ``comgra.my_recorder`` where
    left out. ``name``: the prefix of the names, the name the model is tracked under (``track_module``);
    an untracked model is tracked as ``name`` (default ``"model"``) unless ``track_parameters=False``.
    ``include`` / ``exclude``: fnmatch patterns over the module paths of ``model.named_modules()``
    (``"transformer.h.*"``, ``"*.dropout"``; ``""`` is the model itself); ``max_depth``: 0 watches the
    model's own output only, 1 its children too, and so on. On steps that are not recorded the hooks
    return at once. Returns a handle: ``remove()`` takes the hooks off; ``finalize()`` does too. See
    ``comgra.integrations.watch`` for how outputs are named and which are skipped.

        >>> comgra.my_recorder = ComgraRecorder(...)  # doctest: +SKIP
        >>> comgra.watch(model)  # doctest: +SKIP
    """
    from comgra.integrations.watch import watch_model

    return watch_model(model, my_recorder if recorder is None else recorder, name=name, include=include,
                       exclude=exclude, max_depth=max_depth, track_parameters=track_parameters)

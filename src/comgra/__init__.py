"""comgra: computation graph analysis for PyTorch.

The conventional global recorder lives here, as in the original Comgra::

    import comgra
    from comgra.recorder import ComgraRecorder
    comgra.my_recorder = ComgraRecorder(...)

and ``comgra.watch(model)``, which records every module's output without naming tensors by hand;
``comgra.serve(path)`` and ``comgra.show(path)`` run the app from Python and inside a Jupyter notebook.

Importing comgra has no side effects and does not import torch.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from comgra._version import __version__
from comgra.errors import ComgraError, ConfigError, TrainingAborted

__all__ = ["ComgraError", "TrainingAborted", "__version__", "my_recorder", "serve", "show", "watch"]

if TYPE_CHECKING:
    import torch

    from comgra.integrations.notebook import AppURL
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


def serve(path: str | Path | None = None, *, port: int | None = None, host: str = "127.0.0.1",
          visualization_file: str | Path | None = None, poll_seconds: float = 2.0, findings_scan: bool = True,
          allow_hosts: Iterable[str] = (), token: bool | str = True, token_for_reads: bool = False) -> AppURL:
    """Serve the app for the group folder ``path`` (``comgra_root_path/group``) in a background thread and
    return its URL, as ``comgra --path`` does on the command line; the URL's ``stop()`` ends it.

    ``path=None``: the group of ``comgra.my_recorder``, flushed first. ``port=None``: a free port. A second call
    for the same folder returns the running app's URL (with other options it replaces that app). The options
    are those of ``comgra --path`` (``--visualization-file``, ``--poll-seconds``, ``--no-findings-scan``,
    ``--allow-host``). The URL carries the server's token (``?token=...``): every change to a run needs it,
    and with ``token_for_reads=True`` (always off loopback) every read too; ``token=False`` serves without one
    (127.0.0.1 only).

        >>> url = comgra.serve("/tmp/comgra/my_group")  # doctest: +SKIP
        >>> url.stop()  # doctest: +SKIP
    """
    from comgra.integrations.notebook import serve as serve_in_thread

    return serve_in_thread(_group_to_show(path), port=port, host=host, visualization_file=visualization_file,
                           poll_seconds=poll_seconds, findings_scan=findings_scan, allow_hosts=allow_hosts,
                           token=token, token_for_reads=token_for_reads)


def show(path: str | Path | None = None, *, height: int = 800, width: str | int = "100%", port: int | None = None,
         **serve_options: Any) -> None:
    """Show the app for the group folder ``path`` inline in a Jupyter notebook, in the output of the cell.

    It is ``comgra.serve(path, ...)`` shown in an iframe ``height`` pixels high; outside a notebook kernel it
    raises ``ConfigError`` (use ``comgra.serve``). ``path=None``: the group of ``comgra.my_recorder``.

        >>> comgra.show("/tmp/comgra/my_group")  # doctest: +SKIP
    """
    from comgra.integrations.notebook import show as show_inline

    show_inline(_group_to_show(path), height=height, width=width, port=port, **serve_options)


def _group_to_show(path: str | Path | None) -> str | Path:
    """``path``; for None the group of ``comgra.my_recorder``, flushed first so that the app shows every step so far."""
    if path is not None:
        return path
    if my_recorder is None:
        raise ConfigError("comgra.serve() and comgra.show() without a path show the group of comgra.my_recorder, "
                          "and comgra.my_recorder is None; pass the group folder (comgra_root_path/group).")
    my_recorder.flush()
    return my_recorder.options.group_dir

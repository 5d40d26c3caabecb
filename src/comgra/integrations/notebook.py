"""The app from a Python session: ``comgra.serve`` runs it in a background thread and returns its URL;
``comgra.show`` shows it inline in a Jupyter notebook.

One app per group folder and process: a second ``serve`` of the same folder with the same options
returns the running app's URL (the app reads the recording live, so there is nothing to restart);
with other options it stops the running app and starts a new one. The port is one the system finds
free, unless ``port`` names one. The server binds 127.0.0.1: the notebook's browser must run on the
same machine, or reach the port through a tunnel (``ssh -L PORT:127.0.0.1:PORT host``). IPython is
imported only by ``show``.
"""
from __future__ import annotations

import atexit
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit
from typing import Any

from comgra.errors import ConfigError, StoreError

_STOP_SECONDS = 10.0


class AppURL(str):
    """The URL of an app that ``comgra.serve`` runs in this process (a ``str``), with ``stop()`` to end it.

        >>> url = comgra.serve("/tmp/comgra/my_group")  # doctest: +SKIP
        >>> url.stop()  # doctest: +SKIP
    """

    path: Path
    base: str  # the address without the token: base + "api/v1/trials" is a REST call
    token: str | None  # for 'Authorization: Bearer <token>'; None where served with token=False

    def stop(self) -> bool:
        """Stop serving (the port is free again once this returns); False where it was stopped already."""
        with _LOCK:
            served = _SERVING.get(self.path)
            if served is None or served.url != self or served.url.path != self.path:
                return False
            del _SERVING[self.path]
        served.stop()
        return True


@dataclass
class _Served:
    url: AppURL
    options: tuple[Any, ...]
    server: Any  # werkzeug.serving.BaseWSGIServer
    thread: threading.Thread

    def stop(self) -> None:
        self.server.shutdown()  # serve_forever returns; the request in flight (if any) is answered first
        self.thread.join(_STOP_SECONDS)
        self.server.server_close()


_SERVING: dict[Path, _Served] = {}
_LOCK = threading.Lock()
_STOPPED_AT_EXIT: list[bool] = []  # non-empty once _stop_all is registered with atexit


def serve(path: str | Path, *, port: int | None = None, host: str = "127.0.0.1",
          visualization_file: str | Path | None = None, poll_seconds: float = 2.0, findings_scan: bool = True,
          allow_hosts: Iterable[str] = (), token: bool | str = True, token_for_reads: bool = False) -> AppURL:
    """Serve the app for the group folder ``path`` in a background thread; returns its URL (see the module)."""
    group = group_folder(path)
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535):
        raise ConfigError(f"port={port!r} is not a port; pass an int from 1 to 65535, or None for a free one.")
    options = (host, str(Path(visualization_file).expanduser().resolve()) if visualization_file else None,
               float(poll_seconds), bool(findings_scan), tuple(sorted(allow_hosts)), token, bool(token_for_reads))
    with _LOCK:
        served = _SERVING.pop(group, None)
        if served is not None and served.thread.is_alive() and served.options == options \
                and port in (None, served.server.server_port):
            _SERVING[group] = served
            return served.url
        if served is not None:
            served.stop()  # other options: the new app takes its place (and its port, where it is asked for)
        _SERVING[group] = served = _start(group, port or 0, options)
    return served.url


def show(path: str | Path, *, height: int = 800, width: str | int = "100%", **serve_options: Any) -> None:
    """Show the app for the group folder ``path`` in the output of the notebook cell (an iframe of ``serve``)."""
    try:
        from IPython import get_ipython
        from IPython.display import IFrame, display
    except ImportError:
        raise ConfigError("comgra.show() shows the app in a Jupyter notebook and needs IPython, which is not "
                          "installed; outside a notebook call comgra.serve(path) and open the URL it returns.") from None
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        raise ConfigError("comgra.show() shows the app in a Jupyter notebook's output, and this Python is not a "
                          "notebook kernel; call comgra.serve(path) instead and open the URL it returns.")
    url = serve(path, **serve_options)
    display(IFrame(str(url), width=width, height=height))


def group_folder(path: str | Path) -> Path:
    """``path`` as a group folder (``comgra_root_path/group``); a root folder gets an error naming its groups."""
    if not isinstance(path, (str, Path)):
        raise ConfigError(f"path={path!r} must be the group folder of a recording (comgra_root_path/group), "
                          "as a str or pathlib.Path.")
    scheme = str(path).split("://", 1)[0].lower() if isinstance(path, str) and "://" in path else None
    if scheme not in (None, "file"):  # a URL: read through a mirror refreshed by each poll (comgra.store.remote)
        return path  # type: ignore[return-value]
    group = Path(unquote(urlsplit(str(path)).path) if scheme == "file" else path).expanduser().resolve()
    if not group.is_dir():
        raise StoreError(f"No recording at {str(group)!r}: the folder does not exist. Pass the group folder, "
                         "i.e. comgra_root_path/group.")
    if not (group / "trials").is_dir():
        groups = sorted(p.name for p in group.iterdir() if (p / "trials").is_dir())
        hint = (f" It holds the groups {groups}: pass e.g. {str(group / groups[0])!r}." if groups else
                f" It is the folder of trial {group.name!r}: pass its group, {str(group.parent.parent)!r}."
                if (group / "trial.json").is_file() and group.parent.name == "trials" else
                " Record a step into it first, or pass the group folder, i.e. comgra_root_path/group.")
        raise StoreError(f"{str(group)!r} is not the group folder of a recording (it has no trials/ folder).{hint}")
    return group


def _start(group: Path, port: int, options: tuple[Any, ...]) -> _Served:
    from comgra.server.app import create_app, make_http_server, start_links

    host, visualization_file, poll_seconds, findings_scan, allow_hosts, token, token_for_reads = options
    app = create_app(group, visualization_file=visualization_file, poll_seconds=max(0.2, poll_seconds),
                     findings_scan=findings_scan)
    try:
        server = make_http_server(app, host=host, port=port, allow_hosts=allow_hosts, token=token,
                                  token_for_reads=token_for_reads)
    except OSError as error:
        raise ConfigError(f"comgra cannot serve on {host}:{port} ({error.strerror or error}); pass another port, "
                          "or port=None for a free one.") from None
    url = AppURL(start_links(app, server)[-1])  # with ?token=...: the browser keeps it as a cookie (127.0.0.1 for 0.0.0.0)
    url.base, url.token = str(url).split("?")[0], app.server.config.get("COMGRA_API_TOKEN")
    url.path = group
    thread = threading.Thread(target=server.serve_forever, name=f"comgra-app-{server.server_port}", daemon=True)
    thread.start()
    if not _STOPPED_AT_EXIT:
        _STOPPED_AT_EXIT.append(True)
        atexit.register(_stop_all)
    return _Served(url, options, server, thread)


def _stop_all() -> None:
    """At exit: no request thread may be inside the app while the interpreter goes down."""
    with _LOCK:
        served = list(_SERVING.values())
        _SERVING.clear()
    for each in served:
        each.stop()

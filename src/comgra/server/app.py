"""Build the Dash app for one recording and serve it.

The app reads through :class:`comgra.service.RecordingService` and keeps no
per-user state on the server: selection state lives in the browser, so two
tabs or two users never interfere. It is served by Werkzeug's threaded WSGI
server (the one Flask and Dash use), bound to 127.0.0.1 unless told otherwise.

    >>> app = create_app("/path/to/root/group")      # doctest: +SKIP
    >>> serve(app, host="127.0.0.1", port=8055)       # doctest: +SKIP
"""
from __future__ import annotations

import atexit
import logging
import socket
import threading
import weakref
from functools import partial
from pathlib import Path

from dash import Dash
from werkzeug.serving import BaseWSGIServer, make_server

from comgra.server import callbacks, layout
from comgra.server.visualization import VisualizationFile
from comgra.service import RecordingService

ASSETS = Path(__file__).parent / "assets"
log = logging.getLogger("comgra.server")


def create_app(path: str | Path, *, visualization_file: str | Path | None = None,
               poll_seconds: float = 2.0, warm_up: bool = True) -> Dash:
    """The app for the group folder ``path`` (``comgra_root_path/group``).

    ``warm_up`` answers the first page's question once in a background thread,
    so that the lazy imports and the step index are ready when a browser asks.
    Raises ``StoreError`` if the folder does not exist.
    """
    service = RecordingService(path)
    visualization = VisualizationFile(visualization_file) if visualization_file else None
    title = str(service.group.path)
    app = Dash(__name__, title=f"comgra · {service.group.path.name}", assets_folder=str(ASSETS),
               serve_locally=True, update_title="")  # "" keeps the title while callbacks run
    app.layout = partial(_page, service, title=title, poll_ms=int(poll_seconds * 1000),
                         with_visualization=visualization is not None)
    callbacks.register(app, service, visualization)
    if warm_up:
        # Not a daemon: the interpreter must not end while it is inside DuckDB (that aborts the process).
        threading.Thread(target=_warm_up, args=(service,), name="comgra-warm-up").start()
    _close_at_exit(service)
    return app


def _close_at_exit(service: RecordingService) -> None:
    """Close the service's connections before the interpreter shuts down, if it is still alive then."""
    reference = weakref.ref(service)

    def close() -> None:
        alive = reference()
        if alive is not None:
            alive.close()

    atexit.register(close)


def _warm_up(service: RecordingService) -> None:
    try:
        view = service.resolve({})
        callbacks.view_outputs(view, {}, None)
        if view.selection is not None:
            callbacks.neurons(service, view.selection)
    except Exception:
        log.debug("comgra: warm-up failed", exc_info=True)  # the real request reports any problem


def _page(service: RecordingService, *, title: str, poll_ms: int, with_visualization: bool) -> object:
    try:
        version = service.data_version()
    except OSError:
        version = ""
    return layout.page(title=title, data_version=version, poll_ms=poll_ms, with_visualization=with_visualization)


def make_http_server(app: Dash, *, host: str = "127.0.0.1", port: int = 8055) -> BaseWSGIServer:
    """A threaded HTTP server for the app; ``port=0`` picks a free port (see ``server_port``).

    Raises OSError when the address cannot be bound (Werkzeug would print and exit instead).
    """
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    _check_bindable(host, port)
    try:
        return make_server(host, port, app.server, threaded=True)
    except SystemExit:
        raise OSError(f"cannot bind {host}:{port}") from None


def _check_bindable(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


def serve(app: Dash, *, host: str = "127.0.0.1", port: int = 8055) -> None:
    server = make_http_server(app, host=host, port=port)
    print(f"comgra is serving at {url_of(server)}  (Ctrl+C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def url_of(server: BaseWSGIServer) -> str:
    host = server.host if ":" not in server.host else f"[{server.host}]"
    return f"http://{host}:{server.server_port}/"

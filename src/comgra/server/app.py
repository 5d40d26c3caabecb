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
import ctypes
import ipaddress
import logging
import os
import secrets
import socket
import threading
import weakref
from collections.abc import Iterable
from functools import partial
from pathlib import Path

from dash import Dash
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException
from werkzeug.serving import BaseWSGIServer, make_server

from comgra.server import api, callbacks, layout, tensors, view_state
from comgra.server.visualization import VisualizationFile
from comgra.service import RecordingService

ASSETS = Path(__file__).parent / "assets"
log = logging.getLogger("comgra.server")
# The largest request body accepted (413 beyond): a callback's state is a few kilobytes.
MAX_REQUEST_BYTES = 4 * 1024 * 1024
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
_ALLOWED_HOSTS = "COMGRA_ALLOWED_HOSTS"  # Flask config key: a set of host names, or None for any host


def create_app(path: str | Path, *, visualization_file: str | Path | None = None,
               poll_seconds: float = 2.0, warm_up: bool = True, findings_sensitivity: float | None = None,
               findings_scan: bool = True) -> Dash:
    """The app for the group folder ``path`` (``comgra_root_path/group``).

    ``warm_up`` answers the first page's question once in a background thread,
    so that the lazy imports and the step index are ready when a browser asks.
    ``findings_scan=False`` scans nothing in the background: the Findings tab and the graph's badges
    show what ``comgra scan`` saved in the recording (a huge recording opens without a scan's cost).
    Raises ``StoreError`` if the folder does not exist.
    """
    service = RecordingService(path)
    if findings_sensitivity is not None or not findings_scan:  # a bad sensitivity is a ConfigError
        service.configure_findings(sensitivity=findings_sensitivity, background=findings_scan)
    visualization = VisualizationFile(visualization_file) if visualization_file else None
    title = str(service.group.path)
    app = Dash(__name__, title=f"comgra · {service.group.path.name}", assets_folder=str(ASSETS),
               serve_locally=True, update_title="",  # "" keeps the title while callbacks run
               on_error=_callback_failed)
    _guard_requests(app.server)
    app.layout = partial(_page, service, title=title, poll_ms=int(poll_seconds * 1000),
                         with_visualization=visualization is not None)
    callbacks.register(app, service, visualization)
    api.install(app.server, service)  # the REST API under /api/v1, from the same service
    if warm_up:
        # pandas imported here, before the warm-up thread imports it: plotly's JSON encoder takes pandas from
        # sys.modules, and a first request served while that thread was still inside its import found the module
        # partially initialised (AttributeError: no pandas.NaT; HTTP 500 on the first page's /_dash-layout).
        import pandas  # noqa: F401
        # Not a daemon: the interpreter must not end while it is inside DuckDB (that aborts the process).
        threading.Thread(target=_warm_up, args=(service,), name="comgra-warm-up").start()
    _close_at_exit(service)
    return app


def _callback_failed(error: Exception) -> None:
    """Last resort for a callback that raised: the page keeps what it shows (no 500, no traceback)."""
    log.error("comgra: a callback failed", exc_info=error)


def _guard_requests(server: Flask) -> None:
    """Host check (against DNS rebinding), a body size limit, and errors without tracebacks."""
    server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
    server.config[_ALLOWED_HOSTS] = set(LOCAL_HOSTS)  # until make_http_server says where it is bound
    server.before_request(partial(_check_host, server))
    server.register_error_handler(Exception, _error_response)


def _check_host(server: Flask) -> Response | None:
    allowed = server.config[_ALLOWED_HOSTS]
    host = _host_name(request.host)
    if allowed is None or host in allowed:
        return None
    return Response(f"Host {host!r} is not allowed: comgra answers only {sorted(allowed)}. "
                    "Start it with --allow-host NAME to allow another name.\n", status=403, mimetype="text/plain")


def _host_name(host_header: str) -> str:
    """The name in a Host header, without port or IPv6 brackets, lowercased."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _error_response(error: Exception) -> Response | HTTPException:
    if isinstance(error, HTTPException):
        return error  # 400, 404, 413, ... as Werkzeug words them, without a traceback
    from dash.exceptions import DependencyException

    if isinstance(error, DependencyException):  # /_dash-component-suites/ of no file Dash serves (../.., a typo)
        return Response("Not found: Dash serves no such file.\n", status=404, mimetype="text/plain")
    if isinstance(error, RecursionError):  # a request body nested deeper than any parser goes: bad input, not a fault
        return Response("Bad request: the body is nested too deeply.\n", status=400, mimetype="text/plain")
    log.error("comgra: a request failed: %s %s", request.method, request.path, exc_info=error)
    if request.path.endswith("/_dash-update-component"):  # callbacks have on_error: the request itself is bad
        return Response("Bad request: comgra could not read this callback request.\n", status=400,
                        mimetype="text/plain")
    return Response("comgra hit an internal error; the terminal that runs the app shows the details.\n",
                    status=500, mimetype="text/plain")


def allowed_hosts(host: str, extra: Iterable[str] = ()) -> set[str] | None:
    """The Host header names to answer when bound to ``host``; None means any.

    As Jupyter does: bound to a loopback address, the localhost names; bound to every
    interface (0.0.0.0, ::), any name; otherwise the bound name. ``extra`` adds names.
    """
    if host in ("", "0.0.0.0", "::"):
        return None
    names = {_host_name(host if ":" not in host else f"[{host}]"), *(_host_name(h) for h in extra)}
    return names | LOCAL_HOSTS if _is_loopback(host) else names


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host.lower() == "localhost"


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
        view_state.view_outputs(view, {}, None)
        if view.selection is not None:
            tensors.neurons(service, view.selection)
    except Exception:
        log.debug("comgra: warm-up failed", exc_info=True)  # the real request reports any problem


def _page(service: RecordingService, *, title: str, poll_ms: int, with_visualization: bool) -> object:
    try:
        version = service.data_version()
    except OSError:
        version = ""
    return layout.page(title=title, data_version=version, poll_ms=poll_ms, with_visualization=with_visualization)


def make_http_server(app: Dash, *, host: str = "127.0.0.1", port: int = 8055,
                     allow_hosts: Iterable[str] = ()) -> BaseWSGIServer:
    """A threaded HTTP server for the app; ``port=0`` picks a free port (see ``server_port``).

    It answers only requests whose Host header names it (see ``allowed_hosts``);
    ``allow_hosts`` adds names, e.g. the name of a reverse proxy.
    Raises OSError when the address cannot be bound (Werkzeug would print and exit instead).
    """
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app.server.config[_ALLOWED_HOSTS] = allowed_hosts(host, allow_hosts)
    # Reachable from other machines: the REST API's state-changing calls need a token (printed by serve).
    app.server.config[api.TOKEN_CONFIG] = None if _is_loopback(host) else secrets.token_urlsafe(24)
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


def serve(app: Dash, *, host: str = "127.0.0.1", port: int = 8055, allow_hosts: Iterable[str] = ()) -> None:
    server = make_http_server(app, host=host, port=port, allow_hosts=allow_hosts)
    token = app.server.config.get(api.TOKEN_CONFIG)
    # Reachable from other machines: the link carries the token, which the browser keeps as a cookie.
    print(f"comgra is serving at {url_of(server)}{f'?token={token}' if token else ''}  (Ctrl+C to stop)", flush=True)
    if token:
        print(f"Token for state-changing calls (the app's Breakpoints tab, the REST API): {token}  "
              "(REST: send 'Authorization: Bearer <token>')", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


SERVER_MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's mallopt parameter number


def limit_malloc_arenas(count: int = SERVER_MALLOC_ARENAS) -> bool:
    """At most ``count`` glibc malloc arenas in this process, unless ``MALLOC_ARENA_MAX`` says otherwise.

    Werkzeug answers each request on a new thread, and glibc gives threads arenas of their own, up to
    eight per core. Each arena keeps the pages of the largest answers built in it (free blocks between
    live ones cannot be handed back), and a live run's KPI and step answers grow with the run: under 20
    REST clients the server's RSS grew by about 12 MiB a minute at 17 arenas (benchmarks/server_memory.py).
    glibc fixes the limit when a second thread first allocates, so this must run before the process
    starts a thread (DuckDB, the warm-up, the first request): ``comgra`` calls it first thing when it
    serves. Importing comgra or building the app changes no allocator. False where nothing was changed
    (not glibc, or the user's own setting)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(_M_ARENA_MAX, count))


def url_of(server: BaseWSGIServer) -> str:
    host = server.host if ":" not in server.host else f"[{server.host}]"
    return f"http://{host}:{server.server_port}/"

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
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from dash import Dash
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException
from werkzeug.serving import BaseWSGIServer, make_server

from comgra.server import api, callbacks, layout, tensors, view_state
from comgra.server.doors import READS_CONFIG
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
               findings_scan: bool = True, scan_in_child: bool = False) -> Dash:
    """The app for the group folder ``path`` (``comgra_root_path/group``).

    ``warm_up`` answers the first page's question once in a background thread,
    so that the lazy imports and the step index are ready when a browser asks.
    ``findings_scan=False`` scans nothing in the background: the Findings tab and the graph's badges
    show what ``comgra scan`` saved in the recording (a huge recording opens without a scan's cost).
    ``scan_in_child`` runs each background scan in a child process (``comgra``'s own server: the scan's memory goes
    back to the system with it; ``service/scan_process.py``).
    Raises ``StoreError`` if the folder does not exist.
    """
    _import_what_answers_need()
    service = RecordingService(path)
    if findings_sensitivity is not None or not findings_scan or scan_in_child:  # a bad sensitivity: a ConfigError
        service.configure_findings(sensitivity=findings_sensitivity, background=findings_scan, in_child=scan_in_child)
    visualization = VisualizationFile(visualization_file) if visualization_file else None
    title = str(service.group.path)
    app = Dash(__name__, title=f"comgra · {service.group.path.name}", assets_folder=str(ASSETS),
               serve_locally=True, update_title="",  # "" keeps the title while callbacks run
               on_error=_callback_failed)
    _guard_requests(app.server)
    # The first page holds the Tensors tab alone; the others are built when first opened (layout.py says why).
    app.validation_layout = layout.full_page(  # type: ignore[assignment]  # Dash declares it as None
        with_visualization=visualization is not None)
    app.layout = partial(_page, service, title=title, poll_ms=int(poll_seconds * 1000),
                         with_visualization=visualization is not None)
    callbacks.register(app, service, visualization, build_panels=partial(layout.panel_contents, service=service))
    api.install(app.server, service)  # the REST API under /api/v1, from the same service
    app.server.wsgi_app = _answering(service, app.server.wsgi_app)  # type: ignore[method-assign]
    if warm_up:
        # Not a daemon: the interpreter must not end while it is inside DuckDB (that aborts the process).
        threading.Thread(target=_warm_up, args=(service,), name="comgra-warm-up").start()
    _close_at_exit(service)
    return app


def _import_what_answers_need() -> None:
    """Import pandas here, in the thread that builds the app, before any other thread runs.

    Plotly's JSON encoder (which Dash uses for the layout and every callback) asks ``sys.modules`` for pandas
    without importing it: while the warm-up thread or a first request was still importing pandas, another
    request thread met the half-initialised module ("partially initialized module 'pandas' has no attribute
    'NaT'"), a 500, and the page said "Error loading layout" (issue 31 item 14). Every answer needs pandas
    anyway (the store reads into DataFrames), so it is imported once, whole, before serving."""
    import pandas  # noqa: F401


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
    from comgra.errors import disk_problem

    if disk_problem(error):  # a full or read-only disk: what happened, not "an internal error"
        return Response(f"comgra could not write: {disk_problem(error)}.\n", status=507, mimetype="text/plain")
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


def _answering(service: RecordingService, wsgi_app: Callable[..., Any]) -> Callable[..., Any]:
    """Each request answered inside ``service.answering()``: the background findings scan starts no trial meanwhile
    (its work held the GIL, and the Runs tab clicked at once on a fresh app over 1,000 trials waited for it)."""
    def answered(environ: Any, start_response: Any) -> Any:
        with service.answering():
            return wsgi_app(environ, start_response)

    return answered


def _warm_up(service: RecordingService) -> None:
    with service.answering():  # answers a person will ask for at once: the scan waits for them too
        _warm_answers(service)


def _warm_answers(service: RecordingService) -> None:
    try:
        view = service.resolve({})
        view_state.view_outputs(view, {}, None)
        if view.selection is not None:
            tensors.neurons(service, view.selection)
        if len(service.trials()) > 1:  # a sweep: the Runs tab's rows, once the first page's answer is ready
            service.runs()
    except Exception:
        log.debug("comgra: warm-up failed", exc_info=True)  # the real request reports any problem


def _page(service: RecordingService, *, title: str, poll_ms: int, with_visualization: bool) -> object:
    try:
        version = service.data_version()
    except OSError:
        version = ""
    return layout.page(title=title, data_version=version, poll_ms=poll_ms, with_visualization=with_visualization)


def make_http_server(app: Dash, *, host: str = "127.0.0.1", port: int = 8055,
                     allow_hosts: Iterable[str] = (), token: bool | str = True,
                     token_for_reads: bool = False) -> BaseWSGIServer:
    """A threaded HTTP server for the app; ``port=0`` picks a free port (see ``server_port``).

    It answers only requests whose Host header names it (see ``allowed_hosts``);
    ``allow_hosts`` adds names, e.g. the name of a reverse proxy.
    ``token``: True makes a new random token, a string is used as the token (at least 16 characters),
    False serves without one (loopback only: an explicit opt-out for a single-user machine). Every
    state-changing request needs the token; reads need it too off loopback or with ``token_for_reads``.
    The link that carries it is ``start_links``. Raises OSError when the address cannot be bound (Werkzeug
    would print and exit instead) and ConfigError for a token setting that cannot be honoured.
    """
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app.server.config[_ALLOWED_HOSTS] = allowed_hosts(host, allow_hosts)
    app.server.config[api.TOKEN_CONFIG] = _chosen_token(token, host, token_for_reads)
    app.server.config[READS_CONFIG] = bool(token_for_reads) or not _is_loopback(host)
    _check_bindable(host, port)
    try:
        return make_server(host, port, app.server, threaded=True)
    except SystemExit:
        raise OSError(f"cannot bind {host}:{port}") from None


def _chosen_token(token: bool | str, host: str, token_for_reads: bool) -> str | None:
    from comgra.errors import ConfigError

    if token is True:
        return secrets.token_urlsafe(24)
    if isinstance(token, str) and not isinstance(token, bool):
        if len(token) < 16 or not token.isprintable() or any(c in token for c in " &#?%/"):
            raise ConfigError("token= must be at least 16 characters without spaces or any of &#?%/ (it goes into a "
                              "link); pass token=True for a random one.")
        return token
    if token is not False:
        raise ConfigError(f"token={token!r} must be True (a random token), a string, or False (no token).")
    if not _is_loopback(host):
        raise ConfigError(f"Serving on {host!r} without a token would let anyone who reaches the port read the "
                          "recording and change its run; the opt-out (--no-token) is for 127.0.0.1 only.")
    if token_for_reads:
        raise ConfigError("--token-for-reads needs a token; leave out --no-token.")
    return None


def start_links(app: Dash, server: BaseWSGIServer, view: str = "/") -> list[str]:
    """The addresses to open, each with ``?token=`` where the server has one: bound to every interface
    (0.0.0.0, ::), this machine's name and 127.0.0.1 (0.0.0.0 is no address a browser can open)."""
    token = app.server.config.get(api.TOKEN_CONFIG)
    if token:
        view = view + ("&" if "?" in view else "?") + f"token={token}"
    port = server.server_port
    if server.host in ("", "0.0.0.0", "::"):
        bases = [f"http://{socket.gethostname()}:{port}", f"http://127.0.0.1:{port}"]
    else:
        bases = [url_of(server).rstrip("/")]
    return [base + view for base in bases]


def _check_bindable(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


def serve(app: Dash, *, host: str = "127.0.0.1", port: int = 8055, allow_hosts: Iterable[str] = (),
          token: bool | str = True, token_for_reads: bool = False) -> None:
    server = make_http_server(app, host=host, port=port, allow_hosts=allow_hosts, token=token,
                              token_for_reads=token_for_reads)
    # The link carries the token, which the browser keeps as a cookie.
    for link in start_links(app, server):
        print(f"comgra is serving at {link}  (Ctrl+C to stop)", flush=True)
    token_value = app.server.config.get(api.TOKEN_CONFIG)
    if token_value:
        print(f"Token (the Breakpoints tab, the REST API: 'Authorization: Bearer <token>'): {token_value}", flush=True)
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

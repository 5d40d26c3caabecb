"""The doors of the server that change a run: who may go through them, and where they lead.

A state-changing request (a REST POST/PATCH/DELETE, an action of the app's Breakpoints tab) must come from
this page's own origin and carry the server's token, on loopback too (any local user can reach 127.0.0.1):
a bearer header, or the HttpOnly cookie that the link printed at start (``/?token=...``) sets. The REST API
and the app ask the same ``check_state_change``. Reads need the token too where ``READS_CONFIG`` says so:
always off loopback, and on loopback with ``--token-for-reads`` (``check_read``). Only an explicit opt-out
(``--no-token``, loopback only) serves without a token. A trial a request names must be one the recording holds, not a
link out of it (``trial_folder``).
"""
from __future__ import annotations

import hmac
from pathlib import Path
from urllib.parse import urlencode, urlsplit

from flask import Response, current_app, request

from comgra.errors import BreakpointError, SelectionError, StoreError, did_you_mean
from comgra.server.api_spec import API_PREFIX
from comgra.service import RecordingService
from comgra.store import format as fmt
from comgra.store import validation

TOKEN_CONFIG = "COMGRA_API_TOKEN"  # Flask config key: the token state-changing calls need, or None
READS_CONFIG = "COMGRA_TOKEN_FOR_READS"  # Flask config key: True where every request needs the token
TOKEN_COOKIE = "comgra_token"  # set by the link the server prints (/?token=...); HttpOnly, SameSite=Strict


class ApiError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None, problems: list[str] | None = None):
        super().__init__(message)
        self.status, self.message, self.field, self.problems = status, message, field, problems


def trial_folder(service: RecordingService, trial: object) -> Path:
    """The folder of a trial that the recording holds, for breakpoints and run control (REST and app alike).

    A name that is not one of the recording's trials (``../x``, an absolute path) is a SelectionError;
    a trial folder that is a link out of the recording is a StoreError: nothing outside is read or written.
    """
    known = service.trials()
    if not isinstance(trial, str) or trial not in known:
        name = str(trial)[:100]
        raise SelectionError(f"No trial {name!r} in this recording" + did_you_mean(name, known))
    directory = fmt.trial_dir(service.group.path, trial)
    if directory.is_symlink() or not validation.inside(directory, service.group.path):
        raise StoreError(f"Trial {trial!r} is a link to a folder outside the recording; comgra changes nothing "
                         "through it. Copy the trial in instead.")
    return directory


def check_breakpoint_target(service: RecordingService, trial: str, target: object) -> None:
    """Refuse a breakpoint target that is neither a tensor of the recorded graphs nor a tracked module of the
    trial (BreakpointError on field ``target``, with the closest name). While nothing is recorded yet, the
    recording knows no names and every target is let through: the training process checks it at its first step.
    Other faults of the value (not a string, empty) are left to ``control``, which names them."""
    if not isinstance(target, str) or not target.strip():
        return
    known = service.breakpoint_targets(trial)
    name = target.strip()
    if known and name not in known:
        raise BreakpointError(f"target={name[:100]!r} is neither a tensor in the graphs of trial {trial!r} nor one of "
                              f"its tracked modules" + did_you_mean(name[:100], known), field="target")


def check_state_change() -> None:
    """Raise ApiError (403, 401) unless the current request may change a run: from this page's own origin
    and with the server's token (bearer header or cookie), unless the server was started without one."""
    origin = request.headers.get("Origin")
    if origin and urlsplit(origin).netloc.lower() != request.host.lower():
        raise ApiError(403, f"A state-changing call from the web origin {origin[:80]!r} is refused.", "Origin")
    token = current_app.config.get(TOKEN_CONFIG)
    if token and not _token_matches(_given_token(), token):
        raise ApiError(401, "This changes the run and needs comgra's token: open the address with ?token=... that "
                            "comgra printed at start (the browser keeps the token as a cookie), or send "
                            "'Authorization: Bearer <token>'.", "Authorization")


def check_read() -> Response | None:
    """Every request needs the token where the server says so (off loopback, or ``--token-for-reads``): a 401
    that says where the token is, as JSON under the REST API and as text elsewhere. Runs after
    ``accept_token_link``, so the printed link itself gets through."""
    token = current_app.config.get(TOKEN_CONFIG)
    if not token or not current_app.config.get(READS_CONFIG) or _token_matches(_given_token(), token):
        return None
    message = ("This comgra server needs its token for every request: open the address with ?token=... that comgra "
               "printed at start (the browser keeps the token as a cookie), or send 'Authorization: Bearer <token>'.")
    if request.path.startswith(API_PREFIX):
        from flask import json

        body = json.dumps({"error": {"status": 401, "message": message, "field": "Authorization"}})
        return Response(body, status=401, mimetype="application/json", headers={"WWW-Authenticate": "Bearer"})
    return Response(message + "\n", status=401, mimetype="text/plain", headers={"WWW-Authenticate": "Bearer"})


def _given_token() -> str:
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        return header.removeprefix("Bearer ").strip()
    return request.cookies.get(TOKEN_COOKIE, "")


def _token_matches(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode())


def accept_token_link() -> Response | None:
    """``GET /?token=<token>``: keep the token as a cookie for this page's own requests, and drop it from the address."""
    given = request.args.get("token")
    token = current_app.config.get(TOKEN_CONFIG)
    if request.method != "GET" or given is None or not token or request.path.startswith(API_PREFIX):
        return None
    if not _token_matches(given, token):
        return Response("This is not the token that comgra printed at start.\n", status=401, mimetype="text/plain")
    rest = [(name, value) for name, value in request.args.items(multi=True) if name != "token"]
    response = Response(status=303, headers={"Location": request.path + (f"?{urlencode(rest)}" if rest else "")})
    response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict", path="/")
    return response

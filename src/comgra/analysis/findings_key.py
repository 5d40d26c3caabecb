"""The key that signs saved findings: this user's, kept 0600 in the user's config folder.

Saved findings (``comgra.analysis.saved``) are a cache, not a verdict: a file edited by hand (a forged message,
a NaN finding deleted) or copied from someone else's recording must not be shown as comgra's own. Each saved
file carries an HMAC-SHA256 over its content and the data it was computed from, made with a random key that only
this user can read; a file that does not verify is computed again.

The key lives in ``platformdirs.user_config_path("comgra")/findings.key`` (``~/.config/comgra`` on Linux), or in
``$COMGRA_CONFIG_DIR`` when that is set (the tests redirect it there). It is made on first use (32 random bytes,
the folder 0700, the file 0600, created exclusively so that two processes agree on one key). Where no key can be
kept (a read-only home, a key file that another user owns or others can read), a key of this process alone is
used: its findings are saved and verified within the process only, and scanned again by the next one.

    >>> sign(b"content") == sign(b"content")                      # doctest: +SKIP
    True
"""
from __future__ import annotations

import functools
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

log = logging.getLogger("comgra.analysis")
KEY_FILE = "findings.key"
KEY_BYTES = 32
CONFIG_DIR_VARIABLE = "COMGRA_CONFIG_DIR"


def key_path() -> Path:
    """Where this user's key is kept: ``$COMGRA_CONFIG_DIR/findings.key``, else in the user's config folder."""
    chosen = os.environ.get(CONFIG_DIR_VARIABLE)
    if chosen:
        return Path(chosen).expanduser() / KEY_FILE
    import platformdirs

    return platformdirs.user_config_path("comgra") / KEY_FILE


def sign(content: bytes) -> str:
    """HMAC-SHA256 of ``content`` with this user's key, as hex."""
    return hmac.new(_key(str(key_path())), content, "sha256").hexdigest()


def verify(content: bytes, mac: object) -> bool:
    """Whether ``mac`` is this user's signature of ``content`` (compared in constant time)."""
    return isinstance(mac, str) and hmac.compare_digest(sign(content), mac)


@functools.lru_cache(maxsize=4)
def _key(path_text: str) -> bytes:
    path = Path(path_text)
    try:
        return _read_or_create(path)
    except OSError as error:
        log.info("comgra: no key for saved findings at %s (%s); findings are saved for this process only",
                 path, error)
    except _Untrusted as reason:
        log.warning("comgra: %s; findings saved by earlier scans are computed again", reason)
    return secrets.token_bytes(KEY_BYTES)


class _Untrusted(Exception):
    """A key file that others could have written or read."""


def _read_or_create(path: Path) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        return _read(path)
    key = secrets.token_bytes(KEY_BYTES)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(key)
    return key


def _read(path: Path) -> bytes:
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise _Untrusted(f"the key file {str(path)!r} belongs to another user")
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise _Untrusted(f"the key file {str(path)!r} can be read or written by others (chmod 600 it, or delete "
                             "it: comgra makes a new one)")
        key = handle.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:  # a file another process is still writing: its first read may come up short
        raise _Untrusted(f"the key file {str(path)!r} is not a comgra key (delete it: comgra makes a new one)")
    return key

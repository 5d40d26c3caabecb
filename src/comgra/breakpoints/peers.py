"""Which local process a command of the control channel may go to: a loopback address, a process of this
machine that is alive and that listens on the port (Linux: /proc). No torch."""
from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from pathlib import Path
from typing import Any


def is_loopback_address(host: object) -> bool:
    try:
        return isinstance(host, str) and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` listens on 127.0.0.1:``port`` (Linux: /proc); None where this cannot be told.

    False also for a process of another user (its sockets cannot be listed): only the user's own runs."""
    try:
        table = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None
    wanted = f"0100007F:{port:04X}"  # 127.0.0.1, as /proc writes it
    inodes = {fields[9] for fields in (line.split() for line in table)
              if len(fields) > 9 and fields[1] == wanted and fields[3] == "0A"}  # 0A: LISTEN
    if not inodes:
        return False
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for descriptor in descriptors:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{descriptor}") in {f"socket:[{inode}]" for inode in inodes}:
                return True
    return False


def process_alive(document: dict[str, Any]) -> bool:
    """False only when the run's process is known to be gone (same host, no such pid)."""
    pid = document.get("pid")
    if not isinstance(pid, int) or document.get("hostname") != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True

"""An HTTP proxy between comgra and the S3 server that injects the faults of a bad network and a busy store.

Each request meets, with the given probabilities (seeded, so a failing run can be repeated): a dropped connection
before it reaches the store, a ``503 SlowDown`` answer, a stall before it is forwarded, or (for a PUT) the body
forwarded and stored but the connection dropped before the answer, so the client cannot know that it landed.
"""
from __future__ import annotations

import http.client
import http.server
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b'<Message>Please reduce your request rate.</Message></Error>')


@dataclass
class Faults:
    drop: float = 0.0
    slow_down: float = 0.0
    stall: float = 0.0
    stall_seconds: float = 1.0
    put_lost_answer: float = 0.0
    seed: int = 0
    injected: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    sent: Counter[str] = field(default_factory=Counter)  # body bytes answered to the client, by method

    def count(self, method: str, size: int) -> None:
        with self._lock:
            self.sent[method] += size

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._lock = threading.Lock()

    def pick(self, method: str) -> str | None:
        with self._lock:
            self.requests += 1
            roll = self._random.random()
            for kind, chance in (("drop", self.drop), ("slow_down", self.slow_down), ("stall", self.stall),
                                 ("put_lost_answer", self.put_lost_answer if method == "PUT" else 0.0)):
                if roll < chance:
                    self.injected[kind] += 1
                    return kind
                roll -= chance
            return None


class FaultyProxy:
    """``FaultyProxy(upstream, faults)``; ``.url`` is where clients connect; ``.close()`` stops it."""

    def __init__(self, upstream: str, faults: Faults):
        target = urlsplit(upstream)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self) -> None:
                body = self._body()
                fault = proxy.faults.pick(self.command) if proxy.active else None
                if fault == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault == "slow_down":
                    self.send_response(503, "Slow Down")
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    self.wfile.write(SLOW_DOWN)
                    return
                if fault == "stall":
                    time.sleep(proxy.faults.stall_seconds)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding",)}
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    headers["Content-Length"] = str(len(body))
                connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                try:
                    connection.request(self.command, self.path, body=body if body or self.command in ("PUT", "POST")
                                       else None, headers=headers)
                    answer = connection.getresponse()
                    data = answer.read()
                finally:
                    connection.close()
                if fault == "put_lost_answer":  # stored, but the client never hears so
                    self.close_connection = True
                    self.connection.close()
                    return
                self.send_response(answer.status, answer.reason)
                dropped = ("transfer-encoding", "connection") + (() if self.command == "HEAD" else ("content-length",))
                for key, value in answer.getheaders():
                    if key.lower() not in dropped:
                        self.send_header(key, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                    proxy.faults.count(self.command, len(data))

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.faults = faults
        self.active = True
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

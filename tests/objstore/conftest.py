"""A real S3 server for the object-storage tests: ``moto_server`` on 127.0.0.1 at a free port, one per session.

Every test gets a bucket of its own and an environment as a user's would be (``AWS_ENDPOINT_URL``, keys,
region), and a cache folder of its own (the spool and the mirror live under ``XDG_CACHE_HOME``). ``.ci/run``
installs moto[server] with the ``s3test`` extra; without it these tests are skipped.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_server import make_bucket

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """The endpoint URL of a moto S3 server that lives for the test session."""
    pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", "from moto.server import main; main()", "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"moto_server did not start on port {port}")
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    server.terminate()
    server.wait(10)


@pytest.fixture
def s3_env(s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on the S3 server, the AWS environment pointing at it, and a cache folder of the test's own;
    returns the bucket's URL (``s3://<bucket>``)."""
    for name, value in {"AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                        "AWS_DEFAULT_REGION": "us-east-1", "XDG_CACHE_HOME": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return f"s3://{make_bucket(s3_server)}"

"""The served app limits glibc's malloc arenas (see ``limit_malloc_arenas``): thread-per-request answers
kept the pages of the largest answers in up to eight arenas per core, and RSS grew with a live run."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from comgra.server import app


class FakeLibc:
    def __init__(self, calls: list[tuple[int, int]]):
        self.mallopt = lambda parameter, value: calls.append((parameter, value)) or 1


@pytest.fixture
def mallopt_calls(monkeypatch) -> list[tuple[int, int]]:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeLibc(calls))
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    return calls


def test_the_arenas_are_limited(mallopt_calls) -> None:
    assert app.limit_malloc_arenas() is True
    assert mallopt_calls == [(-8, app.SERVER_MALLOC_ARENAS)]  # M_ARENA_MAX


def test_the_users_own_setting_wins(mallopt_calls, monkeypatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "16")
    assert app.limit_malloc_arenas() is False
    assert mallopt_calls == []


def test_no_glibc_changes_nothing(monkeypatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)

    def no_library(name: object) -> None:
        raise OSError("no libc")

    monkeypatch.setattr(ctypes, "CDLL", no_library)
    assert app.limit_malloc_arenas() is False


PROBE = """
import ctypes, sys, threading
from comgra.cli import app as cli  # what `comgra` has imported when it limits them
if sys.argv[1] == "limit":
    from comgra.server.app import limit_malloc_arenas
    limit_malloc_arenas()
kept, barrier = [], threading.Barrier(12)
def work():
    kept.append([bytes(2000) for _ in range(500)])  # glibc's blocks: pymalloc takes those up to 512 bytes
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(12)]
[t.start() for t in threads]
[t.join() for t in threads]
ctypes.CDLL(None).malloc_stats()
"""


def _arenas(mode: str) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("MALLOC_ARENA_MAX", None)
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return sum(line.startswith("Arena ") for line in done.stderr.splitlines())


def test_twelve_request_threads_share_two_arenas() -> None:
    if not hasattr(ctypes.CDLL(None), "malloc_stats"):
        pytest.skip("not glibc")
    assert _arenas("limit") <= app.SERVER_MALLOC_ARENAS
    assert _arenas("none") > app.SERVER_MALLOC_ARENAS  # glibc's default: up to eight per core


def test_comgra_limits_them_before_anything_else_when_it_serves(monkeypatch, tmp_path) -> None:
    from comgra.cli import app as cli
    from comgra.cli.arguments import UsageError

    order: list[str] = []
    monkeypatch.setattr(app, "limit_malloc_arenas", lambda: order.append("limit") or True)
    monkeypatch.setattr(cli, "_run_server", lambda *a, **k: order.append("serve") or 0)
    with pytest.raises(UsageError):  # a usage error answers before anything heavy, and serves nothing
        cli._serve(SimpleNamespace(use_path_for_test_run=False, path=tmp_path / "missing", path_option=None))
    assert order == []
    (tmp_path / "group" / "trials").mkdir(parents=True)
    assert cli._serve(cli._parser().parse_args([str(tmp_path / "group")])) == 0
    assert order == ["limit", "serve"]  # the allocator is limited before the server (and its threads) start


def test_building_the_app_changes_no_allocator(mallopt_calls, recording) -> None:
    app.create_app(recording, poll_seconds=60, warm_up=False, findings_scan=False)
    assert mallopt_calls == []

"""``comgra scan GROUP --engine ray`` on a real two-node Ray cluster (issue 30 item 2): a head node and a worker node,
each a ``ray start`` process of its own, one CPU each. The worker node is killed while one of its tasks is
scanning; Ray runs that task again on the head node, and every trial ends with exactly one findings file, the
same findings as a local scan, and nothing doubled.

The cluster's processes are this test's own: each ``ray start --block`` runs in a session of its own and is
ended by its process group at teardown (``ray stop`` would end every Ray on the machine, others' included)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.slow
TRIALS = 16
RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start(arguments: list[str], temp_dir: str) -> subprocess.Popen:
    environment = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.Popen([RAY, "start", "--block", "--num-cpus=1", "--disable-usage-stats",
                             f"--temp-dir={temp_dir}", *arguments], env=environment, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _end(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=60)


def _session_processes(process: subprocess.Popen) -> list:
    found = []
    for candidate in psutil.process_iter(["pid"]):
        try:
            if os.getsid(candidate.pid) == process.pid:
                found.append(candidate)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


@pytest.fixture
def cluster(monkeypatch):
    """A head node and a worker node on this machine; yields (address, head, worker). Token authentication on
    for every process of the test (the nodes, ``ray status``, the scan's driver): Ray's default token in
    ``~/.ray/auth_token``."""
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    temp_dir = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths must fit 107 characters
    port = _free_port()
    address = f"127.0.0.1:{port}"
    head = _start(["--head", f"--port={port}", "--include-dashboard=false", "--node-ip-address=127.0.0.1"], temp_dir)
    worker = None
    try:
        _wait_for_nodes(address, 1, head)
        worker = _start([f"--address={address}", "--node-ip-address=127.0.0.1"], temp_dir)
        _wait_for_nodes(address, 2, head)
        yield address, head, worker
    finally:
        for process in (worker, head):
            if process is not None:
                _end(process)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _wait_for_nodes(address: str, count: int, head: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert head.poll() is None, "the Ray head node ended"
        answer = subprocess.run([RAY, "status", f"--address={address}"], capture_output=True, text=True, check=False)
        if answer.returncode == 0 and answer.stdout.count("node_") >= count:
            return
        time.sleep(3)
    pytest.fail(f"the Ray cluster at {address} did not reach {count} node(s)")


def _running_task_on(worker: subprocess.Popen) -> bool:
    """Whether a worker process of the worker node is running a scan task (Ray names it after the task)."""
    for process in _session_processes(worker):
        try:
            if any("_scan_task" in part for part in process.cmdline()):
                return True
        except psutil.Error:
            continue
    return False


def _rows_per_trial(group: Path) -> dict[str, int]:
    import duckdb

    rows = duckdb.sql(f"SELECT trial, count(*) FROM read_parquet('{group}/findings/*/*/*.parquet', "
                      "hive_partitioning = true, union_by_name = true) GROUP BY trial").fetchall()
    return dict(rows)


def test_a_scan_on_ray_survives_a_lost_worker_node_and_doubles_nothing(cluster, sweep, tmp_path) -> None:
    address, head, worker = cluster
    from comgra.store import GroupReader

    trials = GroupReader(sweep).trials()[:TRIALS]
    local = tmp_path / "local"
    shutil.copytree(sweep, local)
    chosen = [a for t in trials for a in ("--trial", t)]
    expected = subprocess.run([sys.executable, "-m", "comgra.cli.app", "scan", str(local), "--json", *chosen],
                              capture_output=True, text=True, timeout=900, check=True)

    scan = subprocess.Popen([sys.executable, "-m", "comgra.cli.app", "scan", str(sweep), "--json", "--engine", "ray",
                             "--ray-address", address, *chosen], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 600
    while not _running_task_on(worker):
        assert scan.poll() is None, f"the scan ended before a task ran on the worker node: {scan.stderr.read()}"
        assert time.monotonic() < deadline, "no task ever ran on the worker node"
        time.sleep(0.2)
    _end(worker)  # the node and its workers, mid-task
    out, err = scan.communicate(timeout=900)
    assert scan.returncode == 0, err
    assert out.startswith("{"), (out[:500], err[-3000:])  # Ray's news on stderr: stdout is the document alone
    # The task that ran on the lost node ran again: every trial's findings below equal the local scan's, and one of
    # them was computed on the node killed mid-task. (Ray's own "will be retried" line on stderr depends on how fast
    # it notices the node is gone: it was missing in one run of three.)

    def keys(document: str) -> list[tuple]:
        return sorted((f["trial"], f["detector"], f["node"], f["training_step"], f["message"])
                      for f in json.loads(document)["findings"])

    assert keys(out) == keys(expected.stdout)
    per_trial = {t: len([p for p in (sweep / "findings").glob(f"trial={t}/rank=0/*") if p.is_file()]) for t in trials}
    assert per_trial == {t: 1 for t in trials}  # one file per trial, no temporary left behind
    assert _rows_per_trial(sweep) == _rows_per_trial(local)
    assert len(list(sweep.glob("trials/*/analysis/*.json"))) == TRIALS

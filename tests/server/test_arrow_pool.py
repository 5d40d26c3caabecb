"""The server's process takes Arrow's buffers from jemalloc, not from mimalloc (issue 31 item 13): mimalloc kept
the pages that the server's short-lived request threads freed, and the server's RSS grew with a live run while
Arrow's own count stayed flat (benchmarks/server_hours.py measures the slope; here the mechanism is checked)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from comgra.server import app

PROBE = """
import json, sys
from comgra.store.arrow_pool import use_arrow_pool_that_gives_back
assert "pyarrow" not in sys.modules  # the module loads nothing that loads pyarrow (its choice must come first)
chosen = use_arrow_pool_that_gives_back()  # as comgra calls it: before pyarrow loads
import os
assert "ARROW_DEFAULT_MEMORY_POOL" not in os.environ or sys.argv[2] == "user's"  # children inherit nothing
import pyarrow as pa, pyarrow.parquet as pq
pools = {"mimalloc": pa.mimalloc_memory_pool()}
try:
    pools["jemalloc"] = pa.jemalloc_memory_pool()
except NotImplementedError:
    pass
before = {name: pool.bytes_allocated() for name, pool in pools.items()}
table = pq.read_table(sys.argv[1])  # a chunk read as the server reads small tables
grew = {name: pool.bytes_allocated() - before[name] for name, pool in pools.items()}
print(json.dumps({"chosen": chosen, "default": pa.default_memory_pool().backend_name, "grew": grew,
                  "rows": table.num_rows}))
"""


def _probe(tmp_path: Path, **env: str) -> dict:
    chunk = tmp_path / "chunk.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"training_step": list(range(50_000)), "value": [0.5] * 50_000}), chunk)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env}
    if "ARROW_DEFAULT_MEMORY_POOL" not in env:
        environment.pop("ARROW_DEFAULT_MEMORY_POOL", None)
    done = subprocess.run([sys.executable, "-c", PROBE, str(chunk), "user's" if env else "comgra's"], capture_output=True, text=True,
                          env=environment, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_server_reads_parquet_into_a_pool_that_gives_pages_back(tmp_path: Path) -> None:
    found = _probe(tmp_path)
    assert found["rows"] == 50_000
    assert found["chosen"] in ("jemalloc", "system") and found["default"] == found["chosen"]
    assert found["grew"]["mimalloc"] == 0  # before: pyarrow's default, every read's buffers came from it
    if found["chosen"] == "jemalloc":
        assert found["grew"]["jemalloc"] > 0


def test_the_users_own_pool_wins(tmp_path: Path) -> None:
    found = _probe(tmp_path, ARROW_DEFAULT_MEMORY_POOL="mimalloc")
    assert found["chosen"] is None and found["default"] == "mimalloc"
    assert found["grew"]["mimalloc"] > 0


def test_comgra_chooses_it_before_it_serves(monkeypatch, tmp_path: Path) -> None:
    from comgra.cli import app as cli

    order: list[str] = []
    monkeypatch.setattr(cli, "use_arrow_pool_that_gives_back", lambda: order.append("arrow pool") or "jemalloc")
    monkeypatch.setattr(app, "limit_malloc_arenas", lambda: order.append("arenas") or True)
    monkeypatch.setattr(cli, "_run_server", lambda *a, **k: order.append("serve") or 0)
    (tmp_path / "group" / "trials").mkdir(parents=True)
    assert cli._serve(cli._parser().parse_args([str(tmp_path / "group")])) == 0
    assert order == ["arrow pool", "arenas", "serve"]  # the pool before pyarrow loads, the arenas before threads


def test_building_the_app_leaves_the_users_pool_alone(recording) -> None:
    assert not hasattr(app, "use_arrow_pool_that_gives_back")
    before = pa.default_memory_pool().backend_name
    app.create_app(recording, poll_seconds=60, warm_up=False, findings_scan=False)  # a notebook's app: user's process
    assert pa.default_memory_pool().backend_name == before


CHILD_PROBE = """
import json, os, sys
# Nothing heavy at the top: a spawned child runs this file again as its main module, as it runs ``comgra``'s
# (whose imports are light: comgra --help loads no pyarrow).


def pool_of_child():
    before = "pyarrow" in sys.modules  # already loaded by the initializer, with the pool it chose
    import pyarrow as pa, pyarrow.parquet as pq
    mimalloc = pa.mimalloc_memory_pool()
    was = mimalloc.bytes_allocated()
    table = pq.read_table(sys.argv[1])
    return {"default": pa.default_memory_pool().backend_name, "rows": table.num_rows, "loaded": before,
            "mimalloc_grew": mimalloc.bytes_allocated() - was, "inherited": os.environ.get("ARROW_DEFAULT_MEMORY_POOL")}


if __name__ == "__main__":
    from comgra.store.arrow_pool import use_arrow_pool_that_gives_back

    use_arrow_pool_that_gives_back()  # as comgra calls it: before pyarrow loads
    from comgra.service import scan_process  # loads pyarrow (the server's own reads)

    with scan_process.child_pool() as pool:  # the child ScanProcess starts
        print(json.dumps(pool.submit(pool_of_child).result()))
"""


def test_the_scans_child_takes_arrows_buffers_from_a_pool_that_gives_back(tmp_path: Path) -> None:
    """The findings scan's child (service/scan_process.py) reads the whole live trial again and again; with
    mimalloc, pyarrow's default, it kept what each scan freed (its RSS reached 523 MiB on a 20-minute run)."""
    import pyarrow.parquet as pq

    chunk = tmp_path / "chunk.parquet"
    pq.write_table(pa.table({"training_step": list(range(50_000)), "value": [0.5] * 50_000}), chunk)
    script = tmp_path / "child_probe.py"  # a file: a spawned child imports its parent's main module by path
    script.write_text(CHILD_PROBE)
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run([sys.executable, str(script), str(chunk)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["rows"] == 50_000 and found["loaded"]
    assert found["default"] in ("jemalloc", "system"), found
    assert found["mimalloc_grew"] == 0, found  # before: the child's every read took its buffers from mimalloc
    assert found["inherited"] is None  # the choice is the child's own: the server's environment stays clean

"""Every command takes its path positionally (``--path`` still accepted), and ``comgra --help`` and usage
errors answer before any heavy import: their CPU time is measured in a subprocess against a bare
``python -c pass``, and the modules they load are listed."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from comgra.cli import app as cli

HEAVY = ("torch", "pyarrow", "duckdb", "pandas", "numpy", "dash", "flask", "scipy", "sklearn", "rich")


def test_the_path_is_positional_in_every_command_and_path_is_still_accepted(recording, tmp_path, capsys,
                                                                             monkeypatch):
    served = []
    monkeypatch.setattr(cli, "_run_server", lambda group, **kw: served.append(group) or 0)
    assert cli.main([str(recording)]) == 0 and cli.main(["--path", str(recording)]) == 0
    assert served == [recording.resolve(), recording.resolve()]
    assert cli.main(["scan", str(recording), "--json"]) == 0
    positional = json.loads(capsys.readouterr().out)
    assert cli.main(["scan", "--path", str(recording), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == positional["findings"]
    assert cli.main(["repair", str(recording)]) == 0 and cli.main(["repair", "--path", str(recording)]) == 0
    capsys.readouterr()
    assert cli.main(["scan", str(recording), "--path", str(tmp_path)]) == 2
    assert "two paths" in capsys.readouterr().err
    assert cli.main(["scan"]) == 2 and "path of a recording is missing" in capsys.readouterr().err
    assert cli.main(["./no-such-group"]) == 2 and "does not exist" in capsys.readouterr().err


def _cpu_of(arguments: list[str] | None) -> tuple[float, list[str], int]:
    """CPU seconds (user + system) of a fresh interpreter running ``comgra ARGUMENTS`` (None: ``python -c
    pass``), and the heavy modules it loaded."""
    probe = ("import runpy, sys, json, atexit\n"
             f"atexit.register(lambda: print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)), "
             "file=sys.__stderr__))\n"
             "sys.argv = ['comgra', *sys.argv[1:]]\n"
             "runpy.run_module('comgra.cli.app', run_name='__main__')\n") if arguments is not None else "pass"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", probe, *(arguments or [])], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "100"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    loaded = json.loads(done.stderr.strip().splitlines()[-1]) if arguments is not None else []
    return cpu, loaded, done.returncode


@pytest.mark.parametrize("arguments, code", [
    (["--help"], 0), (["scan", "--bogus"], 2), (["scan"], 2), (["scan", "/no/such/group"], 2),
    (["repair", "/no/such/group"], 2), (["foo"], 2), (["demo", "--steps", "0"], 2), ([], 2),
])
def test_help_and_usage_errors_answer_before_any_heavy_import(arguments: list[str], code: int) -> None:
    bare = min(_cpu_of(None)[0] for _ in range(3))
    runs = [_cpu_of(arguments) for _ in range(3)]
    assert all(run[2] == code for run in runs), runs
    assert runs[0][1] == [], f"comgra {' '.join(arguments)} imported {runs[0][1]}"
    cpu = min(run[0] for run in runs)
    # A bare interpreter takes ~0.02-0.05 s of CPU; comgra's argument parsing adds argparse and a few modules
    # of its own. Before this was lazy, 'comgra scan' spent 0.4 s of CPU (pyarrow, DuckDB) first.
    assert cpu < bare + 0.25, f"{cpu:.3f} s of CPU against {bare:.3f} s for python -c pass"

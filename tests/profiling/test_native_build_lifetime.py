"""The native marker's build never outlives the process that started it (issue 31 item 15).

A real short script tracks a module with ``profile=True`` and trains two steps: the C++ build of the marker
starts on a thread of its own and the script ends long before it is done. Before, ``c++`` went on as an orphan
(about 800 MB, minutes), its output stayed under a ``.tmp`` name and the next run built again. Now no compiler
of the script is left once it has exited, no ``.tmp`` stays in the cache, builds take a lock, and where no
compiler exists the script profiles on the Python path.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = """
import sys, time, torch
from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder

recorder = ComgraRecorder(sys.argv[1], "group", "trial", DecisionMakerForRecordingsHardcoded({0, 1}),
                          resource_seconds=None)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
recorder.track_module("net", net, profile=True)
for step in range(2):
    with recorder.batch(step, 2):
        recorder.start_iteration()
        loss = net(torch.ones(2, 4)).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        recorder.finish_iteration()
        loss.backward()
recorder.finalize()
time.sleep(float(sys.argv[2]))  # long enough for the build to have started its compiler
print("done", flush=True)
"""


def _environment(cache: Path, **extra: str) -> dict[str, str]:
    source = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": source, "XDG_CACHE_HOME": str(cache), "COMGRA_NATIVE_MARKER": "1", **extra}


def _processes_naming(text: str) -> list[str]:
    """The command lines of the live processes (zombies aside) whose arguments name ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in arguments and state != "Z":
            found.append(arguments)
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler to start")
def test_a_script_shorter_than_the_build_leaves_no_compiler_and_no_tmp(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "store"), "2"], capture_output=True,
                            text=True, timeout=300, env=_environment(cache))
    assert result.returncode == 0 and "done" in result.stdout, result.stderr[-3000:]
    kernels = cache / "comgra" / "kernels"
    assert kernels.is_dir(), "the build never started"
    deadline = time.monotonic() + 5  # SIGKILL is immediate; give the kernel a moment to reap
    while _processes_naming(str(kernels)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_naming(str(kernels)) == [], "a compiler outlived the script"
    assert sorted(p.name for p in kernels.glob("*.tmp")) == [], "a partial build was left"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_script_takes_its_compiler_along(tmp_path: Path) -> None:
    """SIGKILL runs no atexit: the kernel's parent-death signal to the watchdog kills the compiler's group."""
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler to start")
    cache = tmp_path / "cache"
    process = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path / "store"), "60"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_environment(cache))
    kernels = cache / "comgra" / "kernels"
    deadline = time.monotonic() + 120
    while not _processes_naming(str(kernels)) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    assert _processes_naming(str(kernels)), "no compiler was started"
    process.kill()
    process.communicate()
    deadline = time.monotonic() + 10
    while _processes_naming(str(kernels)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_naming(str(kernels)) == [], "a compiler outlived the killed script"


def test_without_a_compiler_the_script_profiles_on_the_python_path(tmp_path: Path) -> None:
    from comgra.store.reader import GroupReader

    cache = tmp_path / "cache"
    bare = tmp_path / "bin"  # a PATH with no compiler on it
    bare.mkdir()
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "store"), "0"], capture_output=True,
                            text=True, timeout=300, env=_environment(cache, PATH=str(bare), CXX="", CC=""))
    assert result.returncode == 0 and "done" in result.stdout, result.stderr[-3000:]
    assert not (cache / "comgra" / "kernels").exists() or not any((cache / "comgra" / "kernels").iterdir())
    layers = GroupReader(tmp_path / "store" / "group").trial("trial").layers()
    assert layers.num_rows > 0 and set(layers["training_step"].to_pylist()) == {0, 1}


def test_concurrent_builds_take_turns_and_leave_one_library(tmp_path: Path) -> None:
    """Two processes build the same small library at once: one compiles, the other waits for the lock and
    finds it built; one library, no .tmp, both load it."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler")
    code = ("import sys\nfrom pathlib import Path\nfrom comgra import native_build\n"
            "library = Path(sys.argv[1]) / 'probe.so'\n"
            "native_build.compile_atomically(library, 'int probe(void) { return 7; }', 'probe.c',\n"
            "    lambda source, target: ['cc', '-shared', '-fPIC', '-o', str(target), str(source)], timeout=120)\n"
            "import ctypes\nprint(ctypes.CDLL(str(library)).probe())\n")
    folder = tmp_path / "kernels"
    source = str(Path(__file__).resolve().parents[2] / "src")
    processes = [subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": source})
                 for _ in range(3)]
    outputs = [p.communicate(timeout=300) for p in processes]
    assert [o[0].strip() for o in outputs] == ["7"] * 3, outputs
    assert sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) == ["probe.so"]

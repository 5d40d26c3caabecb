"""Compiled speed-ups (the statistics kernel in ``fused``, the backward marker in ``native_marker``): how they
are built, cached and loaded.

Each is compiled the first time it is wanted, on a thread of its own, into a per-user cache whose file
name hashes everything the build depends on, so that later processes only load it. A build holds a lock
file beside the target (one build at a time, across processes: the next one finds the library and stops),
writes a temporary name and renames it: a concurrent process sees nothing or a whole library, and what an
earlier build left under a temporary name is removed. The compiler never outlives the process that started
it: it runs in a process group of its own, killed whole when the process exits (``atexit``) and, on Linux,
when it dies (a watchdog shell that the kernel signals as its parent dies, ``PR_SET_PDEATHSIG``). A script
shorter than a build therefore leaves no compiler running; ``ensure_built`` (e.g. ``python -c "from
comgra.profiling.native_marker import ensure_built; ensure_built()"``) builds once and waits.
Loading (with the caller's self-test) happens on the thread that asks after the build is done. Until
then, and wherever there is no compiler, the build fails, the self-test refuses the library or the
environment switch is ``0``, ``LazyBuild.get`` answers None and the caller keeps its Python path: these
are speed-ups, never requirements.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "comgra" / "kernels"


def cached_library(stem: str, key_parts: Iterable[str], suffix: str) -> Path:
    """Where a build of ``stem`` that depends on ``key_parts`` (source, flags, compiler, platform...) lives."""
    key = hashlib.sha256("\0".join(key_parts).encode()).hexdigest()[:16]
    return cache_dir() / f"{stem}-{key}{suffix}"


def find_compiler(environment_variable: str, names: Iterable[str]) -> str | None:
    """The compiler the environment names (``CC``, ``CXX``), else the first of ``names`` on the PATH."""
    for name in (os.environ.get(environment_variable, ""), *names):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def compile_atomically(library: Path, source: str, source_name: str, command: Callable[[Path, Path], list[str]],
                       timeout: float) -> None:
    """Compile ``source`` (written to a temporary ``source_name``) with ``command(source, target)`` into a
    temporary name beside ``library``, then rename it into place; under the build lock, and not at all where
    another process built it meanwhile. Raises where the compiler fails, takes longer than ``timeout`` or is
    killed because this process exits."""
    library.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(library):
        if library.exists():
            return  # built by another process while this one waited for the lock
        for stale in library.parent.glob(f".{library.name}.*.tmp"):  # only a lock holder writes these: stale
            stale.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory() as folder:
            source_path = Path(folder) / source_name
            source_path.write_text(source)
            partial = library.parent / f".{library.name}.{os.getpid()}.tmp"
            try:
                _run_compiler(command(source_path, partial), timeout, partial)
                os.replace(partial, library)
            finally:
                partial.unlink(missing_ok=True)


@contextlib.contextmanager
def _build_lock(library: Path) -> Iterator[None]:
    """An exclusive lock on ``.<library>.lock`` (fcntl; where there is none, no lock: the rename still keeps
    readers safe). The kernel lets go of it when the process ends, however it ends."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(library.parent / f".{library.name}.lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# A watchdog between this process and the compiler: the kernel sends it SIGTERM when its parent thread dies
# (PR_SET_PDEATHSIG), and it then kills its whole process group: the compiler driver and what it started.
_WATCHDOG = 'trap "kill -KILL 0" TERM HUP INT; "$@" & wait $!'
_PR_SET_PDEATHSIG = 1
_running: dict[int, Path] = {}  # process group of a running compiler -> its partial output
_running_lock = threading.Lock()


def _run_compiler(arguments: list[str], timeout: float, partial: Path) -> None:
    posix = os.name == "posix"
    command = ["/bin/sh", "-c", _WATCHDOG, "sh", *arguments] if posix and os.path.exists("/bin/sh") else arguments
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=posix,
                               preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    with _running_lock:
        _running[process.pid] = partial
    try:
        _, errors = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        process.communicate()
        raise
    finally:
        with _running_lock:
            _running.pop(process.pid, None)
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, arguments, stderr=errors)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child, between fork and exec
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # bound now: the child must not look it up
    except (OSError, AttributeError):
        return lambda *arguments: 0


_PRCTL: Any = _prctl() if sys.platform == "linux" else None


def _kill_group(group: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(group, signal.SIGKILL) if os.name == "posix" else os.kill(group, signal.SIGTERM)


@atexit.register
def _stop_running_builds() -> None:
    """At exit: no compiler of this process goes on running, and nothing it wrote stays behind."""
    with _running_lock:
        running = dict(_running)
        _running.clear()
    for group, partial in running.items():
        _kill_group(group)
        with contextlib.suppress(OSError):
            os.waitpid(group, 0)
        partial.unlink(missing_ok=True)


class LazyBuild:
    """One compiled speed-up of this process: built on first use, then loaded once.

    ``library_path()`` says where the build belongs (None: it cannot be built here), ``build(path)``
    compiles it there, ``load(path)`` loads and self-tests it (None: refused). ``value`` is the loaded
    object or None; read it first on hot paths, ``get()`` only where it is None."""

    def __init__(self, *, thread_name: str, switch: str, library_path: Callable[[], Path | None],
                 build: Callable[[Path], None], load: Callable[[Path], Any]):
        self.thread_name, self.switch = thread_name, switch
        self.library_path, self.build, self.load = library_path, build, load
        self.lock = threading.Lock()
        self.value: Any = None
        self.building = self.failed = False
        self.pid = os.getpid()

    def get(self) -> Any:
        """The loaded object, or None; the first call loads a cached build or starts one."""
        if self.value is not None or self.failed:
            return self.value
        with self.lock:
            if self.pid != os.getpid():  # a forked child: a build thread of the parent does not run here
                self.building, self.pid = False, os.getpid()
            if self.value is not None or self.building or self.failed:
                return self.value
            if os.environ.get(self.switch, "1") == "0":
                self.failed = True
                return None
            library = self.library_path()
            if library is None:
                self.failed = True
            elif library.exists():
                self.value = self.load(library)
                self.failed = self.value is None
            else:
                self.building = True
                threading.Thread(target=self._build, args=(library,), name=self.thread_name, daemon=True).start()
            return self.value

    def ensure_built(self, timeout: float) -> bool:
        """Build (or load) now and wait for it; True if it is usable. For tests and benchmarks."""
        self.get()
        thread = next((t for t in threading.enumerate() if t.name == self.thread_name), None)
        if thread is not None:
            thread.join(timeout)
        return self.get() is not None

    def _build(self, library: Path) -> None:
        try:
            self.build(library)
        except Exception:  # noqa: BLE001 - a speed-up only: no compiler, no writable cache, a failed build
            self.failed = True
        finally:
            self.building = False

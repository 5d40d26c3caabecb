"""The layout of ``src/comgra`` keeps its shape: imports flow one way, with no circles, and no module grows
past what one can read at once.

The imports are read with ``ast`` (every ``import`` in a module: at the top, inside functions, under
``if TYPE_CHECKING``), so a lazy or type-only import counts like any other. The documented direction
(docs/code-layout.md):

- the read side: ``cli -> server -> service -> analysis -> store``, each importing only what comes after it
  (and ``cli -> examples``: ``comgra demo`` records the tutorial);
- the torch side: ``comgra`` (the facade) ``-> recorder -> capture | profiling | breakpoints -> store``, the
  three middle packages never importing each other; ``examples`` and ``integrations`` use the facade, which imports ``integrations.watch`` when ``comgra.watch`` is called;
- shared leaves that any package may import: ``errors``, ``_version``, ``objects``, ``config``,
  ``native_build``, ``terminal``; they import only each other, except ``config``, which checks breakpoint entries
  with the control channel;
- the one bridge between the sides: the control channel of a running training (``breakpoints.control``
  and the condition language it checks, ``breakpoints.conditions``: files and a loopback socket, no
  torch), used by the server and ``config`` (and aliased as ``comgra.live``, its old import path);
- nothing imports ``server`` or ``cli`` from outside them, but ``integrations.notebook``, which serves the app
  from a Python session (``comgra.serve``, ``comgra.show``: imported when called); no torch in ``store``, ``analysis``,
  ``service``, ``server``, the shared leaves but ``objects``, or the control channel.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "comgra"
MAX_MODULE_LINES = 500

READ_SIDE = ("cli", "server", "service", "analysis", "store")  # each may import those after it
SHARED = ("errors", "_version", "objects", "config", "native_build", "terminal")
CHANNEL = ("comgra.breakpoints.control", "comgra.breakpoints.conditions", "comgra.breakpoints.private_files",
           "comgra.breakpoints.peers")
MAY_IMPORT = {
    "comgra": {"recorder", "integrations"},  # comgra.watch, imported when called
    "recorder": {"capture", "profiling", "breakpoints", "store"},
    "capture": {"store"},
    "profiling": {"store"},
    "breakpoints": {"store"},
    "examples": {"comgra", "recorder"},
    "integrations": {"comgra", "recorder", "server"},  # integrations.notebook serves the app (comgra.serve/show)
    "live": set(),  # the old path of the control channel (comgra.live.control): an alias, nothing more
    **{unit: set(READ_SIDE[i + 1:]) for i, unit in enumerate(READ_SIDE)},
    "cli": {*READ_SIDE[1:], "examples"},  # ``comgra demo`` and ``comgra-test-run`` record the tutorial
    **{unit: set() for unit in SHARED},
}
WITHOUT_TORCH = ("store", "analysis", "service", "server", "errors", "_version", "config", "terminal", "live", *CHANNEL)


def module_imports(package: Path) -> dict[str, set[str]]:
    """Every module of ``package`` -> the modules of the same package it imports (all imports, anywhere)."""
    root = package.name
    files = {_module_name(path, package): path for path in sorted(package.rglob("*.py"))}
    found: dict[str, set[str]] = {}
    for name, path in files.items():
        found[name] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, name, path.name == "__init__.py"):
                if target == root or target.startswith(root + "."):
                    found[name].add(target if target in files else target.rsplit(".", 1)[0])
    return found


def _module_name(path: Path, package: Path) -> str:
    parts = (package.name, *path.relative_to(package).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join([*parts, base] if base else parts)
    return [f"{base}.{alias.name}" for alias in node.names]  # a submodule, or a name in ``base``


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph.get(module, ()):
            if other not in graph:
                continue
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1 or module in graph[module]:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def _unit(module: str) -> str:
    """The package or top-level module a module belongs to: "service" for comgra.service.steps."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def wrong_directions(graph: dict[str, set[str]]) -> list[str]:
    """Every import against the documented direction, as "importer -> imported"."""
    wrong = []
    for module, imported in sorted(graph.items()):
        unit = _unit(module)
        allowed = MAY_IMPORT.get(unit, set()) | {unit, *SHARED}
        if unit in SHARED:
            allowed = set(SHARED)
        for target in sorted(imported):
            bridge = target in CHANNEL and (unit in ("server", "live") or module.endswith(".config"))
            if _unit(target) not in allowed and not bridge:
                wrong.append(f"{module} -> {target}")
    return wrong


def torch_imports(package: Path, units: tuple[str, ...]) -> list[str]:
    """The modules of ``units`` (packages, top-level modules or full module names) that import torch."""
    found = []
    for path in sorted(package.rglob("*.py")):
        name = _module_name(path, package)
        if _unit(name) not in units and name not in units:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if any(t == "torch" or t.startswith("torch.") for t in _targets(node, name, path.name == "__init__.py")):
                found.append(name)
                break
    return found


# -- the package as it is ---------------------------------------------------------------------------
def test_no_module_imports_another_that_imports_it_back() -> None:
    assert import_circles(module_imports(PACKAGE)) == []


def test_imports_follow_the_documented_direction() -> None:
    assert wrong_directions(module_imports(PACKAGE)) == []


def test_the_read_side_and_the_control_channel_never_import_torch() -> None:
    assert torch_imports(PACKAGE, WITHOUT_TORCH) == []


def test_every_package_is_placed_in_the_direction() -> None:
    """A new folder or top-level module is a decision about where it stands: unknown units fail here."""
    units = {_unit(name) for name in module_imports(PACKAGE)}
    assert units <= set(MAY_IMPORT), sorted(units - set(MAY_IMPORT))


def test_no_module_is_longer_than_one_can_read_at_once() -> None:
    lengths = {path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines())
               for path in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES} == {}


# -- the checks can fail ------------------------------------------------------------------------------
def _planted(tmp_path: Path, files: dict[str, str]) -> Path:
    """A copy of the package's tree of modules, all empty but ``files``."""
    package = tmp_path / "comgra"
    skeleton = {path.relative_to(PACKAGE).as_posix(): "" for path in PACKAGE.rglob("*.py")}
    for name, text in {**skeleton, **files}.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_a_planted_circle_is_caught(tmp_path: Path) -> None:
    package = _planted(tmp_path, {
        "service/a.py": "from comgra.service import b\n",
        "service/b.py": "def f():\n    from comgra.service.c import g\n",  # a lazy import counts too
        "service/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from comgra.service.a import x\n",
        "service/d.py": "from . import e\n",
        "service/e.py": "from .d import y\n",
    })
    circles = import_circles(module_imports(package))
    assert circles == [["comgra.service.a", "comgra.service.b", "comgra.service.c"],
                       ["comgra.service.d", "comgra.service.e"]]


@pytest.mark.parametrize(("importer", "text", "wrong"), [
    ("store/reader.py", "from comgra.service import RecordingService\n", "comgra.store.reader -> comgra.service"),
    ("service/steps.py", "from comgra.server import app\n", "comgra.service.steps -> comgra.server.app"),
    ("capture/step.py", "from comgra.profiling import layer_calls\n",
     "comgra.capture.step -> comgra.profiling.layer_calls"),
    ("breakpoints/recording.py", "from comgra.recorder import ComgraRecorder\n",
     "comgra.breakpoints.recording -> comgra.recorder"),
    ("errors.py", "from comgra.store import format\n", "comgra.errors -> comgra.store.format"),
    ("server/api.py", "from comgra.breakpoints import monitor\n", "comgra.server.api -> comgra.breakpoints.monitor"),
])
def test_a_planted_import_against_the_direction_is_caught(tmp_path: Path, importer: str, text: str,
                                                          wrong: str) -> None:
    package = _planted(tmp_path, {importer: text})
    assert wrong_directions(module_imports(package)) == [wrong]


def test_the_bridge_and_imports_along_the_direction_pass(tmp_path: Path) -> None:
    package = _planted(tmp_path, {
        "server/api.py": "from comgra.breakpoints import control\nfrom comgra.service import x\nfrom comgra import errors\n",
        "service/steps.py": "from comgra.store.reader import TrialReader\nfrom comgra.analysis import scan\n",
        "recorder.py": "from comgra.capture import step\nfrom comgra.profiling import instruments\n",
    })
    assert wrong_directions(module_imports(package)) == []


def test_a_planted_torch_import_is_caught(tmp_path: Path) -> None:
    package = _planted(tmp_path, {"service/steps.py": "def f():\n    import torch.nn\n",
                                  "capture/step.py": "import torch\n"})
    assert torch_imports(package, WITHOUT_TORCH) == ["comgra.service.steps"]


def test_the_old_import_path_of_the_control_channel_is_the_same_module() -> None:
    import comgra.breakpoints.control
    import comgra.live.control
    from comgra.live.control import add_breakpoint

    assert comgra.live.control is comgra.breakpoints.control
    assert add_breakpoint is comgra.breakpoints.control.add_breakpoint

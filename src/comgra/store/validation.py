"""What the reader checks before it trusts a file of a recording.

A recording may be damaged (a crash, a full disk, a hand edit) or hostile (a
folder downloaded from someone else). The reader never lets that surface as a
raw ``KeyError``/``IndexError``: a document that is not what the writer writes
is a ``StoreError`` naming the file and what is wrong, and a value named by the
recording (a graph hash, a chunk name) is never used as a path unless it has
the exact shape the writer gives it.
"""
from __future__ import annotations

import json
import numbers
import os
import re
import stat
from pathlib import Path
from typing import Any

import pyarrow as pa

from comgra.errors import SelectionError, StoreError
from comgra.store import format as fmt

# capture/graph.py graph_hash: the first 16 hex digits of a sha256.
_GRAPH_HASH = re.compile(r"[0-9a-f]{16}")
# The characters DuckDB's read_parquet treats as a glob pattern; "[c]" matches c literally.
_GLOB_CHARACTERS = frozenset("*?[]")


def glob_escaped(path: Path | str) -> str:
    """``path`` as a read_parquet pattern that matches exactly that one file.

    DuckDB reads every path it is given as a glob: a trial named ``run[12]`` would
    read ``run1`` and ``run2``, one named ``run*`` every trial. A backslash escapes
    the next character there and cannot itself be escaped, so a path that holds one
    next to a glob character is refused (the recorder never writes a backslash).
    """
    text = str(path)
    if "\\" in text and any(c in _GLOB_CHARACTERS for c in text):
        raise StoreError(f"Cannot read {text!r}: DuckDB reads a backslash next to '*', '?', '[' or ']' as a "
                         "pattern. Move the recording to a folder without backslashes in its path.")
    return "".join(f"[{c}]" if c in _GLOB_CHARACTERS else c for c in text)


def check_graph_hash(graph_hash: Any, trial_id: str) -> str:
    if not isinstance(graph_hash, str) or _GRAPH_HASH.fullmatch(graph_hash) is None:
        raise StoreError(f"Trial {trial_id!r} names the graph {graph_hash!r} in its steps index, which is not a "
                         "graph hash (16 lowercase hex digits): the steps index is damaged.")
    return graph_hash


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path``, with every symlink followed, lies in ``folder`` (itself resolved).

    A path written below ``folder`` (no ``..`` in either) none of whose parts below it is a link lies in it whatever
    ``folder`` resolves to: that needs one ``lstat`` per part below ``folder``. Any other path is resolved whole
    (``realpath``: an ``lstat`` per part from the root, for a trial's file about 20 in Python, 1,000 trials'
    rows of the Runs view computed at a click spent a tenth of a second on them)."""
    try:
        relative = os.path.relpath(path, folder)  # lexical: trusted only where neither path has a ".." part
        if not any(".." in os.fspath(p).split(os.sep) for p in (path, folder, relative)):
            below = os.fspath(folder)
            for part in ([] if relative == "." else relative.split(os.sep)):
                below = os.path.join(below, part)
                if os.path.islink(below):
                    break
            else:
                return True
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))
    except (OSError, ValueError):
        return False


def load_json(path: Path, what: str) -> Any:
    """A JSON document, or a StoreError naming the file (unreadable, not a regular file, not JSON, nested too deep)."""
    try:
        return json.loads(read_regular_file(path))
    except NotRegularFile:
        raise StoreError(f"{what} {str(path)!r} is not a regular file (a FIFO, a device or a folder); comgra opens "
                         "only regular files. Replace it with the file the recorder wrote.") from None
    except RecursionError:
        raise StoreError(f"{what} {str(path)!r} is nested too deeply to be a comgra document.") from None
    except (OSError, ValueError) as error:
        raise StoreError(f"{what} {str(path)!r} is unreadable ({error}).") from error


class NotRegularFile(OSError):
    """A path that is a FIFO, a device, a socket or a folder: reading it could block forever."""


def read_regular_file(path: Path) -> bytes:
    """The bytes of a regular file; ``NotRegularFile`` for anything else, found without blocking (a FIFO is
    opened non-blocking, then refused). A link to itself raises OSError (ELOOP), as opening it does."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise NotRegularFile(f"{str(path)!r} is not a regular file")
        os.set_blocking(descriptor, True)
        with os.fdopen(descriptor, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(descriptor)


def check_metadata(metadata: Any, path: Path, newest_version: int) -> dict[str, Any]:
    if not isinstance(metadata, dict):
        raise StoreError(f"Trial metadata {str(path)!r} is a JSON {type(metadata).__name__}, not an object: "
                         "the file is damaged.")
    version = metadata.get("format_version")
    if type(version) is not int or version < 1:  # noqa: E721 - True is an int but no version
        raise StoreError(f"Trial {path.parent.name!r} has format_version {version!r} in {str(path)!r}; it must be "
                         f"a positive integer (this comgra reads up to {newest_version}): the file is damaged.")
    if version > newest_version:
        raise StoreError(f"Trial {path.parent.name!r} was written in format_version {version!r}, but this comgra "
                         f"reads up to {newest_version}. Upgrade comgra: pip install -U comgra")
    for key, kind in (("config", dict), ("modules", list)):
        if metadata.get(key) is not None and not isinstance(metadata[key], kind):
            raise StoreError(f"Trial metadata {str(path)!r} has a {key!r} that is a JSON "
                             f"{type(metadata[key]).__name__}, not a {'n object' if kind is dict else ' list'}.")
    return metadata


def check_graph(document: Any, path: Path) -> dict[str, Any]:
    """The graph document, if it has the fields the app reads with the types it needs."""
    problem = _graph_problem(document)
    if problem:
        raise StoreError(f"Graph {str(path)!r} is not a comgra graph: {problem}.")
    return document


def _graph_problem(document: Any) -> str | None:
    if not isinstance(document, dict):
        return f"the document is a JSON {type(document).__name__}, not an object"
    nodes, edges = document.get("nodes"), document.get("edges", [])
    if not isinstance(nodes, list) or not nodes:
        return "'nodes' is missing, empty or not a list"
    ids = set()
    for node in nodes:
        problem = _node_problem(node)
        if problem:
            return problem
        ids.add(node["id"])
    if len(ids) != len(nodes):
        return "two nodes have the same id"
    if not isinstance(edges, list):
        return "'edges' is not a list"
    for edge in edges:
        if not isinstance(edge, dict) or edge.get("source") not in ids or edge.get("target") not in ids:
            return f"the edge {_short(edge)} does not link two nodes of the graph"
        if not all(isinstance(edge.get(k, ""), str) for k in ("source_role", "target_role")):
            return f"the edge {_short(edge)} has a role that is not a string"
    return None


def _node_problem(node: Any) -> str | None:
    if not isinstance(node, dict):
        return f"the node {_short(node)} is not an object"
    if not all(isinstance(node.get(k), str) for k in ("id", "node", "role")):
        return f"the node {_short(node)} lacks a string 'id', 'node' or 'role'"
    if not all(_is_int(node.get(k)) for k in ("column", "row")):
        return f"the node {node['id']!r} lacks an integer 'column' or 'row'"
    roles = node.get("roles", [])
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        return f"the node {node['id']!r} has 'roles' that are not a list of strings"
    if not _is_int(node.get("iteration_offset", 0)) or not _is_int(node.get("absolute_iteration", 0), none=True):
        return f"the node {node['id']!r} has an iteration that is not an integer"
    return None


def _is_int(value: Any, *, none: bool = False) -> bool:
    # Bounded: a number of 400 digits is no row or column, and would make the layout's arithmetic slow.
    return (value is None and none) or (type(value) is int and abs(value) < 2**31)  # noqa: E721


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class ChunkDamaged(ValueError):
    """A chunk that must not be used: ``reason`` says why, in words for the problems list."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def check_chunk_schema(actual: pa.Schema, expected: pa.Schema, *, rank_optional: bool,
                       may_lack: tuple[str, ...] = ()) -> None:
    """Raise ``ChunkDamaged`` unless a chunk has exactly the columns of its table, each of its type.

    Names alone are not enough: a column of the right name and another type is read as junk (a string
    cast to a number, an int64 step read as a float) or fails deep inside a query. ``rank_optional``:
    format 1 has no ``rank`` column. ``may_lack``: columns added later (format.ADDED_COLUMNS), absent in older chunks.
    """
    names = [n for n in expected.names if not (rank_optional and n == "rank" and n not in actual.names)
             and not (n in may_lack and n not in actual.names)]
    if sorted(actual.names) != sorted(names) or len(set(actual.names)) != len(actual.names):
        missing = sorted(set(names) - set(actual.names))
        extra = sorted(set(actual.names) - set(names))
        raise ChunkDamaged(f"not a chunk of this table: columns missing {missing[:5]}, unknown {extra[:5]}")
    for name in names:
        found, wanted = actual.field(name).type, expected.field(name).type
        if not _same_type(found, wanted):
            raise ChunkDamaged(f"not a chunk of this table: column {name!r} is {found}, not {wanted}")


def _same_type(found: pa.DataType, wanted: pa.DataType) -> bool:
    """Equal types; a list's item may be named by its writer (``item``, ``element``)."""
    if pa.types.is_list(wanted):
        return pa.types.is_list(found) and _same_type(found.value_type, wanted.value_type)
    return found.equals(wanted)


MODULE_DEPTH = 64  # deeper than any real network's module tree; a hostile tree ends here


def module_tree_problem(tree: Any, depth: int = 0) -> str | None:
    """What is wrong with one tracked module tree of ``trial.json`` (as ``capture.modules`` writes it), or None."""
    if depth > MODULE_DEPTH:
        return f"nested deeper than {MODULE_DEPTH} levels"
    if not isinstance(tree, dict):
        return f"{_short(tree)} is not an object"
    if not all(isinstance(tree.get(k, ""), str) for k in ("name", "full_name", "type")):
        return f"the module {_short(tree.get('name'))} has a name or type that is not a string"
    if not _is_int(tree.get("num_parameters", 0)):
        return f"the module {_short(tree.get('name'))} has a num_parameters that is not an integer"
    parameters, submodules = tree.get("parameters") or [], tree.get("submodules") or []
    if not isinstance(parameters, list) or not isinstance(submodules, list):
        return f"the module {_short(tree.get('name'))} has parameters or submodules that are not a list"
    for parameter in parameters:
        if not isinstance(parameter, dict) or not all(isinstance(parameter.get(k, ""), str)
                                                      for k in ("name", "full_name", "tied_to")):
            return f"the parameter {_short(parameter)} is not an object with string names"
        shape = parameter.get("shape") or []
        if not (_is_int(parameter.get("numel", 0)) and isinstance(shape, list) and all(_is_int(d) for d in shape)):
            return f"the parameter {_short(parameter.get('name'))} has a numel or shape that is not integers"
    for child in submodules:
        problem = module_tree_problem(child, depth + 1)
        if problem:
            return problem
    return None


def check_filter_values(filters: dict[str, Any], *, sets: bool = False) -> None:
    """A reader's query filters: every value a string or a 64-bit integer; with ``sets``, also a list of such
    (``steps_selection``)."""
    for key, value in filters.items():
        if sets and isinstance(value, list) and value:
            for item in value:
                check_filter_values({key: item})
            continue
        if isinstance(value, str) or (isinstance(value, numbers.Integral) and not isinstance(value, bool)
                                      and -2**63 <= int(value) < 2**63):  # numpy ints too, but True is no step
            continue
        raise SelectionError(f"The filter {key}={value!r} is not a string or a 64-bit integer.")


def read_trial_metadata(directory: Path) -> dict[str, Any]:
    """trial.json of a trial folder, checked (never read through a link that leaves the trial)."""
    path = directory / fmt.TRIAL_META
    if not inside(path, directory):
        raise StoreError(f"Trial metadata {str(path)!r} is a link to a file outside the trial; comgra reads nothing "
                         "outside the recording. Copy the file in instead.")
    return check_metadata(load_json(path, "Trial metadata"), path, fmt.FORMAT_VERSION)

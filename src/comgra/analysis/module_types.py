"""What the recorded module trees say about a node: the class of the module whose output it is.

``track_module`` (and ``comgra.watch``, the callbacks) write each tracked model's module tree into the trial's
metadata, with every module's full name and class name; a watched module's output is the node of that full name.
Detectors ask it where a finding is true by construction of the layer (a normalisation sets its output's scale
itself, whatever the scale of its input).
"""
from __future__ import annotations

from typing import Any

NORMALISATIONS = ("norm",)  # LayerNorm, RMSNorm, LlamaRMSNorm, T5LayerNorm, BatchNorm2d, GroupNorm, ...


def types(data: Any) -> dict[str, str]:
    """Full module name -> class name, over every module tree of the trial (empty without a reader or trees)."""
    found = getattr(data, "_module_types", None)
    if found is not None:
        return found
    found = {}
    metadata = getattr(getattr(data, "reader", None), "metadata", None) or {}
    trees = metadata.get("modules") if isinstance(metadata, dict) else None
    stack = list(trees or [])
    while stack:
        tree = stack.pop()
        if not isinstance(tree, dict):
            continue
        if isinstance(tree.get("full_name"), str) and isinstance(tree.get("type"), str):
            found[tree["full_name"]] = tree["type"]
        stack.extend(tree.get("submodules") or [])
    data._module_types = found
    return found


def is_normalisation(data: Any, node: str) -> bool:
    """Whether ``node`` is the output of a normalisation layer (its class name says Norm)."""
    kind = types(data).get(node)
    return kind is not None and any(word in kind.lower() for word in NORMALISATIONS)

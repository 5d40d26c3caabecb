"""Tracked modules: unique names for modules and parameters, and the tree shown in the app."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from comgra.errors import ConfigError, RecordingError


@dataclass
class ModuleTracker:
    """Names every tracked module ``root.sub.subsub`` and parameter ``root.sub.weight``.

    A parameter reached under several names (tied weights: a GPT's ``lm_head.weight`` is
    ``wte.weight``) is one parameter: it is recorded once, under the first name met, the
    others are its ``aliases``, and the module tree marks them ``tied_to`` the first.
    """

    module_names: dict[int, str] = field(default_factory=dict)  # id(module) -> full name
    parameters: dict[str, torch.nn.Parameter] = field(default_factory=dict)  # first name -> parameter
    aliases: dict[str, list[str]] = field(default_factory=dict)  # first name -> the other names
    trees: list[dict[str, Any]] = field(default_factory=list)
    roots: dict[str, torch.nn.Module] = field(default_factory=dict)  # module_name -> the tracked module
    _first_name: dict[int, str] = field(default_factory=dict)  # id(parameter) -> first name

    def track(self, module_name: str, module: torch.nn.Module) -> None:
        if not isinstance(module, torch.nn.Module):
            raise RecordingError(f"track_module({module_name!r}, ...) needs a torch.nn.Module, "
                                 f"got {type(module).__name__}.")
        if "." in module_name or not module_name:
            raise RecordingError(f"module_name={module_name!r} must be non-empty and contain no '.'; "
                                 "dots separate the levels of the module tree, e.g. 'main_model'.")
        if any(str(tree["name"]) == module_name for tree in self.trees):
            raise RecordingError(f"A module is already tracked as {module_name!r}; choose another module_name.")
        self.trees.append(self._tree(module_name, module_name, module))
        self.roots[module_name] = module

    def _tree(self, name: str, full_name: str, module: torch.nn.Module) -> dict[str, Any]:
        self.module_names.setdefault(id(module), full_name)
        inner = unwrapped(module)
        while inner is not module:  # a wrapper takes the name of what it wraps, and adds no level
            module, inner = inner, unwrapped(inner)
            self.module_names.setdefault(id(module), full_name)
        parameters: list[dict[str, Any]] = []
        # remove_duplicate=False: one parameter under two attribute names of a module is tied too.
        for parameter_name, parameter in module.named_parameters(recurse=False, remove_duplicate=False):
            full = f"{full_name}.{parameter_name}"
            entry = {"name": parameter_name, "full_name": full, "shape": list(parameter.shape),
                     "numel": parameter.numel(), "requires_grad": parameter.requires_grad}
            first = self._first_name.setdefault(id(parameter), full)
            if first == full:
                self.parameters[full] = parameter
            else:
                self.aliases.setdefault(first, []).append(full)
                entry["tied_to"] = first
            parameters.append(entry)
        submodules = [self._tree(child, f"{full_name}.{child}", sub) for child, sub in module.named_children()]
        # A tied parameter counts once, where it was met first, as in sum(p.numel() for p in model.parameters()).
        total = sum(int(p["numel"]) for p in parameters if "tied_to" not in p) + \
            sum(int(s["num_parameters"]) for s in submodules)
        return {"name": name, "full_name": full_name, "type": type(module).__name__,
                "num_parameters": total, "parameters": parameters, "submodules": submodules}

    def name_of(self, module: torch.nn.Module) -> str:
        try:
            return self.module_names[id(module)]
        except KeyError:
            raise RecordingError(f"Module {type(module).__name__} is not tracked; call "
                                 "track_module(name, module) on it or on a module that contains it.") from None


# Wrappers that add a level to the names of module.named_parameters() but not to the model: DDP ("module."),
# torch.compile ("_orig_mod."), FSDP1 ("_fsdp_wrapped_module."). FSDP2's fully_shard adds none.
_WRAPPED_AS = {"DistributedDataParallel": "module", "DataParallel": "module", "OptimizedModule": "_orig_mod",
               "FullyShardedDataParallel": "_fsdp_wrapped_module"}


def unwrapped(module: torch.nn.Module) -> torch.nn.Module:
    """The module inside a wrapper of ``_WRAPPED_AS``, else ``module`` itself: the parameters are recorded under
    the model's own names (``model.0.weight``, not ``model.module.0.weight``) whichever wrapper was tracked."""
    attribute = _WRAPPED_AS.get(type(module).__name__)
    inner = module._modules.get(attribute) if attribute is not None else None
    return inner if isinstance(inner, torch.nn.Module) else module


def parameter_nodes(names: list[str], visual_prefixes: list[str], node_prefixes: list[str]) -> dict[str, tuple[str, str]]:
    """Each parameter's (node name, visual group), from the prefix options of ComgraRecorder."""
    for prefix in node_prefixes:
        if not any(prefix.startswith(v) for v in visual_prefixes):
            raise ConfigError(f"prefixes_for_grouping_module_parameters_in_nodes has {prefix!r}, which no entry of "
                              f"prefixes_for_grouping_module_parameters_visually covers ({visual_prefixes}); "
                              "add a visual prefix that it starts with, e.g. ''.")
    result = {}
    for name in names:
        group = next((v for v in visual_prefixes if name.startswith(v)), None)
        if group is None:
            raise ConfigError(f"Parameter {name!r} matches no prefix in prefixes_for_grouping_module_parameters_"
                              f"visually={visual_prefixes}; add one that it starts with, or '' to catch all.")
        node = next((p for p in node_prefixes if name.startswith(p)), name)
        result[name] = (node, group)
    return result

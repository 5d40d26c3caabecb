"""Modes and dtypes that are wrong for the phase, or change within it (from the ``runinfo`` table).

- A dropout (p > 0) or a BatchNorm in training mode on an evaluation step: ``model.eval()`` was not called
  (the evaluation is random, or moves the running statistics); dropout on evaluation steps with no dropout module
  in training mode (``F.dropout(x, p)``: ``comgra.analysis.evaluation_dropout``).
- On training steps, a dropout or BatchNorm whose mode changed (``model.train()`` not called again after an
  evaluation), or a BatchNorm in evaluation mode whose parameters train (its statistics are frozen while
  its affine parameters keep learning: usually a leftover ``eval()``).
- A parameter or registered tensor whose dtype changes between steps of the same type of execution, and
  autocast switched on or off within the training steps.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from comgra.analysis import evaluation_dropout, graphs, module_types
from comgra.analysis import evidence_tables as tables
from comgra.analysis.findings import Finding, ScanOptions
from comgra.analysis.loading import TrialData

MAX_LISTED_MODULES = 8


def detect(data: TrialData, facts: graphs.GraphFacts, options: ScanOptions) -> list[Finding]:
    modes = _modes(data)
    covered = {m for f in modes if f.evidence.get("problem") == "dropout_train_in_evaluation"
               for m in f.evidence.get("modules", [])}
    # A dropout module left in training mode has its finding: the zeros it makes downstream are that one cause.
    dropout = evaluation_dropout.detect(data, facts, covered) if not covered else []
    return modes + dropout + _dtypes(data, facts) + _outside_autocast(data, facts)


LOW_PRECISION = ("bfloat16", "float16")
AUTOCAST_LAYERS = ("linear", "conv")  # module classes whose output autocast computes in its low precision


def _outside_autocast(data: TrialData, facts: graphs.GraphFacts) -> list[Finding]:
    """A layer autocast computes in low precision (Linear, Conv, transformers' Conv1D) whose output is float32 on
    every training step where autocast is on, while most such layers' outputs are bfloat16/float16: it runs
    outside autocast (an ``autocast(enabled=False)`` region, its input or weight cast to float32 first)."""
    enabled = tables.with_phase(data, tables.runinfo_field(data, "autocast", "enabled"))
    if not len(enabled):
        return []
    on = {(int(r), int(s)) for r, s, v, p in zip(enabled["rank"], enabled["training_step"], enabled["value"],
                                                 enabled["phase"]) if v == "True" and p == tables.TRAINING}
    dtypes = tables.runinfo_field(data, "tensor", "dtype")
    if not on or not len(dtypes):
        return []
    types = module_types.types(data)
    layers = {name for name, kind in types.items() if any(word in kind.lower() for word in AUTOCAST_LAYERS)}
    rows = dtypes[[(int(r), int(s)) in on and str(n) in layers for r, s, n in
                   zip(dtypes["rank"], dtypes["training_step"], dtypes["name"])]]
    if not len(rows):
        return []
    seen = rows.groupby("name", observed=True)["value"].agg(lambda values: set(values.astype(str)))
    low = sorted(str(n) for n, v in seen.items() if v <= set(LOW_PRECISION))
    full = sorted(str(n) for n, v in seen.items() if v == {"float32"})
    if not low or not full or len(full) >= len(low):
        return []  # autocast computes nothing in low precision here, or most layers are float32: not one layer's doing
    steps = sorted({int(s) for r, s in on})
    precision = sorted({d for n in low for d in seen[n]})[0]
    findings = []
    for name in sorted(full, key=lambda n: (facts.column.get(n, 0), n)):
        findings.append(Finding(
            detector="run_modes", severity="warning", score=0.8, trial=data.trial, node=name, role=name,
            kind="forward", training_step=steps[0], steps=steps,
            message=f"{name} ({types.get(name)}) computes in float32 on every training step where autocast is on "
                    f"({len(steps)} recorded), while {len(low)} other layers of its kind compute in {precision}: it "
                    "runs outside autocast (a torch.autocast(enabled=False) region, or its input or weight cast to "
                    "float32 before it). Full precision there costs time and memory; if it is not meant to, move it "
                    "inside the autocast region.",
            evidence={"problem": "outside_autocast", "low_precision_layers": len(low), "precision": precision,
                      "float32_layers": full}, aggregation="none", column=facts.column.get(name, 0)))
    return findings


def _module_kinds(data: TrialData) -> dict[str, str]:
    """Tracked module -> "dropout" or "batchnorm", for the modules whose mode changes what they compute."""
    types = tables.runinfo_field(data, "module", "type")
    rates = tables.runinfo_field(data, "module", "p")
    idle = set(rates.loc[rates["number"] == 0, "name"]) if len(rates) else set()
    kinds: dict[str, str] = {}
    for name, kind in zip(types.get("name", []), types.get("value", [])):
        if "Dropout" in str(kind) and name not in idle:
            kinds[str(name)] = "dropout"
        elif "BatchNorm" in str(kind):  # BatchNorm1d/2d/3d, SyncBatchNorm, LazyBatchNorm*
            kinds[str(name)] = "batchnorm"
    return kinds


def _modes(data: TrialData) -> list[Finding]:
    kinds = _module_kinds(data)
    modes = tables.with_phase(data, tables.runinfo_field(data, "module", "mode"))
    if not kinds or not len(modes):
        return []
    modes = modes[modes["name"].isin(list(kinds))]
    trainable = _trainable_modules(data)
    findings: list[Finding] = []
    evaluation = modes[(modes["phase"] == tables.EVALUATION) & (modes["value"] == "train")]
    for kind, rows in _by_kind(evaluation, kinds):
        effect = "its output is random" if kind == "dropout" else "it normalises with the batch's statistics and " \
            "moves its running statistics"
        findings.append(_finding(data, rows, "error" if kind == "dropout" else "warning", 0.95,
                                 f"{_names(rows)} {_verb(rows)} in training mode on evaluation steps ({_steps(rows)}): "
                                 f"{effect}. Call model.eval() before evaluating (and model.train() after).",
                                 {"problem": f"{kind}_train_in_evaluation"}))
    training = modes[modes["phase"] == tables.TRAINING]
    for name, rows in training.groupby("name", sort=True, observed=True):
        seen = list(dict.fromkeys(rows.sort_values("training_step")["value"]))
        if len(seen) > 1:
            first_eval = rows[rows["value"] == "eval"]
            changed = first_eval.sort_values("training_step")
            findings.append(_finding(data, changed, "warning", 0.9,
                                     f"{name} ({kinds[str(name)]}) changes mode between training steps: {seen[0]} mode "
                                     f"first, {seen[1]} mode from step {int(changed['training_step'].min())} "
                                     f"({_steps(changed)}). model.train() was not called again after an evaluation?",
                                     {"problem": "mode_changes_in_training", "modes": seen}))
        elif seen == ["eval"] and kinds[str(name)] == "batchnorm" and trainable.get(str(name), False):
            findings.append(_finding(data, rows, "warning", 0.8,
                                     f"{name} (BatchNorm) is in evaluation mode on every training step while its "
                                     "parameters train: its running statistics never follow the data the network now "
                                     "sees. A leftover model.eval() (or freeze it whole, requires_grad=False).",
                                     {"problem": "batchnorm_eval_in_training"}))
    return findings


def _trainable_modules(data: TrialData) -> dict[str, bool]:
    """Module -> whether any of its own parameters has requires_grad (a module without parameters: False)."""
    grads = tables.runinfo_field(data, "parameter", "requires_grad")
    found: dict[str, bool] = {}
    for name, value in zip(grads.get("name", []), grads.get("value", [])):
        module = str(name).rsplit(".", 1)[0]
        found[module] = found.get(module, False) or value == "True"
    return found


def _by_kind(rows: pd.DataFrame, kinds: dict[str, str]) -> list[tuple[str, pd.DataFrame]]:
    if not len(rows):
        return []
    kind = rows["name"].map(lambda n: kinds[str(n)])
    return [(k, rows[kind == k]) for k in sorted(set(kind))]


def _dtypes(data: TrialData, facts: graphs.GraphFacts) -> list[Finding]:
    """One finding per change (subject, type of execution, from, to, step): a cast changes many at once."""
    nodes = tables.parameter_nodes(data)
    changes: dict[tuple[str, str, str, str, int], list[tuple[str, list[int]]]] = {}
    for subject in ("parameter", "tensor"):
        rows = tables.runinfo_field(data, subject, "dtype")
        if not len(rows):
            continue
        for (name, kind), group in rows.groupby(["name", "type_of_execution"], sort=True, observed=True, dropna=False):
            ordered = group.sort_values("training_step")
            seen = list(dict.fromkeys(ordered["value"]))
            if len(seen) < 2:
                continue
            changed = ordered[ordered["value"] != seen[0]]
            key = (subject, str(kind), seen[0], seen[1], int(changed["training_step"].min()))
            changes.setdefault(key, []).append((str(name), sorted({int(s) for s in changed["training_step"]})))
    findings = []
    for (subject, kind, before, after, step), names in sorted(changes.items()):
        located = sorted(names, key=lambda item: (facts.column.get(nodes.get(item[0], item[0]), 0), item[0]))
        first = located[0][0]
        node = nodes.get(first, first)
        listed = ", ".join(n for n, _ in located[:MAX_LISTED_MODULES]) + (
            f" and {len(located) - MAX_LISTED_MODULES} more" if len(located) > MAX_LISTED_MODULES else "")
        findings.append(Finding(
            detector="run_modes", severity="warning", score=0.85, trial=data.trial, node=node, role=first,
            kind="forward", training_step=step, steps=located[0][1],
            message=f"The dtype of {len(located)} {subject}(s) changes from {before} to {after} at step {step} ({kind}): "
                    f"{listed}. A cast (model.half(), .to(dtype)) or autocast that was not meant for every step?",
            evidence={"problem": "dtype_changes", "dtypes": [before, after], "names": [n for n, _ in located]},
            column=facts.column.get(node, 0)))
    return findings + _autocast(data)


def _autocast(data: TrialData) -> list[Finding]:
    rows = tables.with_phase(data, tables.runinfo_field(data, "autocast", "enabled"))
    rows = rows[rows["phase"] == tables.TRAINING] if len(rows) else rows
    findings = []
    for device, group in (rows.groupby("name", sort=True, observed=True) if len(rows) else []):
        ordered = group.sort_values("training_step")
        seen = list(dict.fromkeys(ordered["value"]))
        if len(seen) > 1:
            changed = ordered[ordered["value"] != seen[0]]
            step = int(changed["training_step"].min())
            findings.append(Finding(
                detector="run_modes", severity="warning", score=0.7, trial=data.trial, node=f"autocast:{device}",
                role=None, kind=None, training_step=step, steps=sorted(set(changed["training_step"])),
                message=f"Autocast on {device} is {'on' if seen[0] == 'True' else 'off'} on the first training steps "
                        f"and {'on' if seen[1] == 'True' else 'off'} from step {step}: the precision of training "
                        "changed partway.", evidence={"problem": "autocast_changes"}))
    return findings


def _finding(data: TrialData, rows: pd.DataFrame, severity: str, score: float, message: str,
             evidence: dict[str, Any]) -> Finding:
    names = sorted(set(rows["name"].astype(str)))
    steps = sorted({int(s) for s in rows["training_step"]})
    # A step is (number, type): the type of the first step, so that the finding's link opens that step where an
    # evaluation shares a training step's number.
    kinds = {str(k) for k in rows.loc[rows["training_step"] == steps[0]].get("type_of_execution", []) if isinstance(k, str)}
    return Finding(detector="run_modes", severity=severity, score=score, trial=data.trial, node=names[0], role=None,
                   kind=None, training_step=steps[0], steps=steps, message=message,
                   evidence={**evidence, "modules": names[:MAX_LISTED_MODULES], "module_count": len(names),
                             **({"type_of_execution": kinds.pop()} if len(kinds) == 1 else {})})


def _names(rows: pd.DataFrame) -> str:
    names = sorted(set(rows["name"].astype(str)))
    shown = ", ".join(names[:MAX_LISTED_MODULES]) + (f" and {len(names) - MAX_LISTED_MODULES} more"
                                                     if len(names) > MAX_LISTED_MODULES else "")
    return shown


def _verb(rows: pd.DataFrame) -> str:
    return "is" if rows["name"].nunique() == 1 else "are"


def _steps(rows: pd.DataFrame) -> str:
    steps = sorted({int(s) for s in rows["training_step"]})
    return ", ".join(map(str, steps[:5])) + (f", ... ({len(steps)} steps)" if len(steps) > 5 else "")

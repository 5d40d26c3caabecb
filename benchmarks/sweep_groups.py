"""Groups shaped like a hyper-parameter sweep, recorded with comgra's own recorder: one small MLP per trial,
10 recorded steps each, a learning rate per trial, and every seventh trial given ReLU units that never fire (a
bias of -20), so that a scan has something to find ("which trials have dying units").

    python benchmarks/sweep_groups.py OUT 100      # OUT/sweep100/sweep (written once, reused)
    python benchmarks/sweep_groups.py OUT 5000 --copy-of OUT/sweep1000/sweep   # 5,000 trials copied from 1,000

``--copy-of`` makes a big group cheaply: trial i is a copy of recorded trial i mod N of the source group under its
own id (its files copied, ``trial.json``'s ``trial_id`` rewritten; format 3 keeps the trial in the folder names
only, so nothing else names it). The copies' findings equal their originals'; the scan's work is the same.

Used by ``benchmarks/sweep_scan.py`` and by the sweep tests (a modest group).
"""
from __future__ import annotations

import sys
from pathlib import Path

GROUP = "sweep"
DEAD_EVERY = 7


def trial_id(index: int) -> str:
    return f"t{index:05d}"


def record_trial(root: Path, index: int, *, steps: int = 10, group: str = GROUP) -> None:
    """One trial: a 4-16-16-1 MLP trained ``steps`` steps, every step recorded."""
    import torch
    from torch import nn

    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    torch.manual_seed(index)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    if index % DEAD_EVERY == 0:
        with torch.no_grad():
            model[0].bias.fill_(-20.0)
    recorder = ComgraRecorder(root, group, trial_id(index), DecisionMakerForRecordingsHardcoded(set(range(steps))),
                              max_num_batch_size_to_record=8)
    recorder.track_module("model", model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001 * (1 + index % 10))
    generator = torch.Generator().manual_seed(index)
    try:
        for step in range(steps):
            x = torch.randn(32, 4, generator=generator)
            y = x[:, :1] - 0.5 * x[:, 1:2]
            recorder.start_batch(step, 32)
            recorder.start_iteration()
            recorder.register_tensor("input", x, is_input=True)
            h = model[1](model[0](x))
            recorder.register_tensor("hidden0", h)
            h = model[3](model[2](h))
            recorder.register_tensor("hidden1", h)
            out = model[4](h)
            recorder.register_tensor("output", out)
            recorder.register_tensor("target", y, is_target=True)
            loss = ((out - y) ** 2).mean()
            recorder.register_tensor("loss", loss, is_loss=True)
            optimizer.zero_grad()
            loss.backward()
            recorder.record_current_gradients("gradients")
            recorder.finish_iteration()
            optimizer.step()
            recorder.finish_batch()
    finally:
        recorder.finalize()


def record_sweep(root: Path, trials: int, *, steps: int = 10, group: str = GROUP) -> Path:
    """``trials`` trials into ``root/group`` (those already there are kept: a group is written once)."""
    import comgra

    have = {p.name for p in (root / group / "trials").glob("*")} if (root / group / "trials").is_dir() else set()
    for index in range(trials):
        if trial_id(index) not in have:
            record_trial(root, index, steps=steps, group=group)
            comgra.my_recorder = None
    return root / group


def copy_sweep(source: Path, root: Path, trials: int, *, group: str = GROUP) -> Path:
    """``trials`` trials into ``root/group``, each a copy of a trial of the recorded group ``source`` (see above)."""
    import json
    import shutil

    originals = sorted(p.name for p in (source / "trials").iterdir() if p.is_dir())
    target = root / group
    skipped = shutil.ignore_patterns("analysis", ".*.lock")
    for index in range(trials):
        trial, original = trial_id(index), originals[index % len(originals)]
        meta = target / "trials" / trial / "trial.json"
        if meta.is_file() and json.loads(meta.read_text()).get("trial_id") == trial:  # copied before
            continue
        for table in [p for p in source.iterdir() if p.is_dir() and p.name not in ("trials", "findings")]:
            if (table / f"trial={original}").is_dir():
                shutil.copytree(table / f"trial={original}", target / table.name / f"trial={trial}",
                                dirs_exist_ok=True)
        folder = target / "trials" / trial
        shutil.copytree(source / "trials" / original, folder, ignore=skipped, dirs_exist_ok=True)
        metadata = json.loads((folder / "trial.json").read_text())
        (folder / "trial.json").write_text(json.dumps({**metadata, "trial_id": trial}))  # its own id: the copy is complete
    return target


if __name__ == "__main__":
    out, count = Path(sys.argv[1]), int(sys.argv[2])
    if "--copy-of" in sys.argv:
        print(copy_sweep(Path(sys.argv[sys.argv.index("--copy-of") + 1]), out / f"sweep{count}", count))
    else:
        print(record_sweep(out / f"sweep{count}", count))

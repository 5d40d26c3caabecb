"""How well ``comgra scan`` finds real training bugs: the PyTorch-native bug benchmark (``benchmarks/bugs/``).

Each program (a short training script with one bug, its fixed twin, or a healthy control of another
architecture) is recorded on CPU with the documented comgra API, then scanned in this process. Per bug it
prints whether a finding at warning or above names the right node with a detector of the right mechanism
(``flagged``), the rank of the first such finding among the warnings (``rank``; '-' when none), the first
warning, and the scan's time; per healthy control and per fixed twin, its warnings. Then the totals against
the targets of issue 24, over the bugs whose evidence comgra records (the others count apart):
>= 90% with the right node in the top 3, >= 70% in the top 1, 0 warnings on the healthy controls, each scan
under 5 s (in this process, the detectors' libraries imported beforehand).

    python benchmarks/bug_benchmark.py                        # everything (a few minutes)
    python benchmarks/bug_benchmark.py --only missing_zero_grad --only vae --verbose
    python benchmarks/bug_benchmark.py --no-twins --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
LOUD = ("error", "warning")
SCAN_SECONDS_TARGET = 5.0


def all_cases() -> list:
    from bugs import (controls, programs_data, programs_evaluation, programs_inputs, programs_issue32, programs_model,
                      programs_training, programs_unrecorded)

    return (programs_training.CASES + programs_model.CASES + programs_data.CASES + programs_unrecorded.CASES
            + programs_issue32.CASES + programs_evaluation.CASES + programs_inputs.CASES + controls.CASES)


@dataclass
class Outcome:
    case: str
    variant: str  # bug, fixed, healthy
    evidence: str
    warnings: list[dict] = field(default_factory=list)
    rank: int | None = None  # of the first warning that names the right node with the right mechanism
    node_rank: int | None = None  # of the first warning that names the right node, whatever its detector
    record_seconds: float = 0.0
    scan_seconds: float = 0.0
    error: str | None = None


def evaluate(case, findings: list) -> tuple[list[dict], int | None, int | None]:
    loud = [f for f in findings if f.severity in LOUD]
    rank = node_rank = None
    for index, finding in enumerate(loud, start=1):
        # A summary finding (one cause over many tensors) names every tensor it lists.
        named = [finding.node] + [m.get("node", "") for m in finding.evidence.get("members", [])]
        right_node = any(_matches(node, case.nodes) for node in named)
        if right_node and node_rank is None:
            node_rank = index
        if right_node and finding.detector in case.symptoms and rank is None:
            rank = index
    listed = [{"severity": f.severity, "detector": f.detector, "node": f.node, "score": round(f.score, 3),
               "message": f.message} for f in loud]
    return listed, rank, node_rank


def _matches(node: str, truth: tuple[str, ...]) -> bool:
    """The node, or a parameter of a named module (``model.layers.4`` names ``model.layers.4.weight``)."""
    return any(node == t or node.startswith(t + ".") for t in truth)


def run_case(root: Path, case, bug: bool, steps: int) -> Outcome:
    from bugs.harness import GROUP, record

    from comgra.analysis import Scanner

    variant = "healthy" if case.healthy else "bug" if bug else "fixed"
    outcome = Outcome(case.name, variant, case.evidence)
    start = time.perf_counter()
    try:
        trial = record(root, case, bug, steps=steps)
    except Exception as error:  # noqa: BLE001 - a program that fails is reported, the others still run
        outcome.error = f"recording failed: {type(error).__name__}: {error}"
        return outcome
    outcome.record_seconds = time.perf_counter() - start
    start = time.perf_counter()
    result = Scanner().scan(root / GROUP, trials=[trial])
    outcome.scan_seconds = time.perf_counter() - start
    if result.problems:
        outcome.error = "; ".join(result.problems)
    outcome.warnings, outcome.rank, outcome.node_rank = evaluate(case, result.findings)
    return outcome


def report(outcomes: list[Outcome], cases: dict, verbose: bool) -> dict:
    bugs = [o for o in outcomes if o.variant == "bug"]
    print(f"{'bug':42} {'evidence':12} {'flagged':7} {'rank':>4} {'node':>4} {'scan s':>6}  first warning")
    for o in bugs:
        first = f"{o.warnings[0]['detector']}@{o.warnings[0]['node']}" if o.warnings else "(none)"
        flagged = o.rank is not None
        print(f"{o.case:42} {o.evidence:12} {'yes' if flagged else 'NO':7} {o.rank or '-':>4} {o.node_rank or '-':>4} "
              f"{o.scan_seconds:6.2f}  {first}" + (f"  ERROR {o.error}" if o.error else ""))
        if verbose:
            for w in o.warnings[:5]:
                print(f"      {w['severity']} {w['detector']}@{w['node']} ({w['score']}): {w['message'][:160]}")
    print()
    for variant in ("healthy", "fixed"):
        group = [o for o in outcomes if o.variant == variant]
        if not group:
            continue
        print(f"{variant} runs: warnings per run")
        for o in group:
            detail = ", ".join(f"{w['detector']}@{w['node']}" for w in o.warnings[:6])
            print(f"  {o.case:42} {len(o.warnings):3}  {detail}" + (f"  ERROR {o.error}" if o.error else ""))
    recorded = [o for o in bugs if o.evidence == "recorded"]
    unrecorded = [o for o in bugs if o.evidence != "recorded"]
    healthy = [o for o in outcomes if o.variant == "healthy"]
    fixed = [o for o in outcomes if o.variant == "fixed"]
    scans = [o.scan_seconds for o in outcomes if o.scan_seconds]
    totals = {
        "bugs_recorded_evidence": len(recorded),
        "flagged": sum(o.rank is not None for o in recorded),
        "top1": sum(o.rank == 1 for o in recorded),
        "top3": sum(o.rank is not None and o.rank <= 3 for o in recorded),
        "right_node_top3_any_detector": sum(o.node_rank is not None and o.node_rank <= 3 for o in recorded),
        "bugs_unrecorded_evidence": len(unrecorded),
        "unrecorded_flagged": sum(o.rank is not None for o in unrecorded),
        "healthy_controls": len(healthy),
        "healthy_warnings": sum(len(o.warnings) for o in healthy),
        "fixed_twins": len(fixed),
        "fixed_twins_with_warnings": sum(bool(o.warnings) for o in fixed),
        "slowest_scan_seconds": max(scans) if scans else 0.0,
    }
    n = max(1, totals["bugs_recorded_evidence"])
    print()
    print(f"bugs whose evidence comgra records: {totals['bugs_recorded_evidence']}; flagged with the right node and "
          f"mechanism: {totals['flagged']}")
    print(f"TARGET right node in top 3: {totals['top3']}/{n} = {totals['top3'] / n:.0%} (target >= 90%): "
          f"{'met' if totals['top3'] >= 0.9 * n else 'NOT met'}")
    print(f"TARGET right node first:    {totals['top1']}/{n} = {totals['top1'] / n:.0%} (target >= 70%): "
          f"{'met' if totals['top1'] >= 0.7 * n else 'NOT met'}")
    print(f"TARGET warnings on healthy controls: {totals['healthy_warnings']} on {totals['healthy_controls']} controls "
          f"(target 0): {'met' if totals['healthy_warnings'] == 0 else 'NOT met'}")
    print(f"TARGET slowest scan: {totals['slowest_scan_seconds']:.2f} s (target < {SCAN_SECONDS_TARGET:g} s): "
          f"{'met' if totals['slowest_scan_seconds'] < SCAN_SECONDS_TARGET else 'NOT met'}")
    print(f"bugs needing evidence comgra does not record yet: {totals['bugs_unrecorded_evidence']}, flagged "
          f"{totals['unrecorded_flagged']} (counted apart)")
    print(f"fixed twins with any warning: {totals['fixed_twins_with_warnings']} of {totals['fixed_twins']} "
          f"(informative: a twin may keep a true finding)")
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="run only this case (repeatable)")
    parser.add_argument("--no-twins", action="store_true", help="do not record the fixed twins")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", type=Path, help="keep the recordings here (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="write the outcomes and totals as JSON")
    parser.add_argument("--verbose", action="store_true", help="list the first warnings of each bug")
    args = parser.parse_args(argv)
    import torch

    import warnings

    from comgra.capture.session import ComgraWarning

    warnings.simplefilter("ignore", ComgraWarning)  # the programs register int targets, as users do
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # The detectors' libraries (pandas, scipy, scikit-learn: a second or two) are imported before the first scan is
    # timed, so that every scan's time is the scan's own.
    import comgra.analysis.detectors  # noqa: F401
    import sklearn.ensemble  # noqa: F401
    cases = {c.name: c for c in all_cases()}
    chosen = [cases[name] for name in args.only] if args.only else list(cases.values())
    root = args.out or Path(tempfile.mkdtemp(prefix="comgra-bugs-"))
    outcomes = []
    try:
        for case in chosen:
            outcomes.append(run_case(root, case, True, args.steps))
            if not case.healthy and case.twin and not args.no_twins:
                outcomes.append(run_case(root, case, False, args.steps))
        totals = report(outcomes, cases, args.verbose)
    finally:
        if args.out is None:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"totals": totals, "outcomes": [o.__dict__ for o in outcomes]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How long ``comgra scan`` takes, whether it grows linearly with the recorded steps, and how fast the
Findings tab opens.

For each scale it writes a synthetic recording shaped like the tutorial's (``synthetic_recording.py``:
2 trials x 240 recorded steps at ``--scale 1``, 50 times as many at ``--scale 50``; cached under
``--out``) and measures, side by side in one run:

* ``comgra scan --path G --json`` as a subprocess (what a user waits for: start-up included);
* a scan in the process, cold (every chunk read) and again with nothing new (the incremental scan
  reads no chunk), and after one new chunk appeared (a live run's flush: only it is read);
* the Findings tab, in a fresh service: its first render (what the tab's callback does: it waits at
  most ``OPEN_WAIT_SECONDS`` for the service's background scanner, then lists what is found and says
  which trials are still being scanned), the time until every finding is listed, and warm;
* the time per recorded step at each scale, so that linearity is shown by the numbers.

    python benchmarks/scan.py                    # scales 1, 10 and 50
    python benchmarks/scan.py --scale 1 --repeats 3
    python benchmarks/scan.py --group G          # an existing recording, e.g. the tutorial's
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def recording(out: Path, scale: float) -> Path:
    """The synthetic recording at ``scale``, written once under ``out``. Scales above 10 that are a
    multiple of 10 repeat the 10x recording's chunks with their steps shifted (the writer needs more
    than an hour for 50x on a loaded 2-core machine; a scan's cost per step does not depend on which
    values repeat)."""
    import synthetic_recording

    root = out / f"scale{scale:g}"
    group = root / synthetic_recording.Options().group
    if not (group / "trials").is_dir():
        if scale > 10 and scale % 10 == 0:
            tile(recording(out, 10.0), group, int(scale // 10))
        else:
            synthetic_recording.write_recording(root, synthetic_recording.Options(scale=scale))
    return group


def tile(source: Path, group: Path, times: int) -> None:
    """``source`` with its tensors and steps chunks repeated ``times`` times, each copy's steps shifted past
    the previous one's; metadata, graphs, KPIs and notes as they are."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from comgra.store import format as fmt

    partial = group.with_name(group.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    for trial in sorted((partial / "trials").iterdir()):
        for table in ("tensors", "steps"):
            chunks = sorted((trial / table).glob("*.parquet"))
            span = max(int(p.name.split("-")[1]) for p in chunks) + 10
            for copy in range(1, times):
                for number, path in enumerate(chunks):
                    data = pq.read_table(path)
                    column = data.schema.get_field_index("training_step")
                    shifted = pa.compute.add(data["training_step"], copy * span).cast(data.schema.field(column).type)
                    first, last = (int(x) + copy * span for x in path.name.split("-")[:2])
                    name = fmt.chunk_name(10**5 * copy + number, first, last, level=1)
                    pq.write_table(data.set_column(column, data.schema.field(column), shifted), trial / table / name,
                                   compression="zstd")
    partial.rename(group)


CPU: dict[str, float] = {}  # the CPU seconds of the last timed call: the machine may be shared, so wall time
# alone says little; CPU time (this process and its children) says what the scan itself costs.


def timed(function, repeats: int, name: str = "") -> float:
    times, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), _cpu_seconds()
        function()
        times.append(time.perf_counter() - start)
        cpu.append(_cpu_seconds() - start_cpu)
    if name:
        CPU[name] = statistics.median(cpu)
    return statistics.median(times)


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(group: Path, repeats: int, *, full: bool = True) -> dict[str, float]:
    """The figures of one recording; ``full=False`` (large recordings) leaves out the subprocess and the
    live-run figures, which repeat what the cold scan says."""
    from comgra.analysis import Scanner
    from comgra.store import GroupReader

    reader = GroupReader(group)
    steps = [len(set(reader.trial(t).steps()["training_step"].to_pylist())) for t in reader.trials()]
    result: dict[str, float] = {"steps": sum(steps), "trials": len(steps)}
    if full:
        result["cli"] = timed(lambda: subprocess.run([sys.executable, "-m", "comgra.cli.app", "scan", "--path",
                                                      str(group), "--json"], check=True, capture_output=True),
                              repeats, "cli")
        result["cpu_cli"] = CPU["cli"]
    result["cold"] = timed(lambda: Scanner().scan(group), repeats, "cold")
    result["cpu_cold"] = CPU["cold"]
    if full:
        result.update(_live_figures(group, repeats))
    result.update(_tab_figures(group, repeats))
    return result


def _live_figures(group: Path, repeats: int) -> dict[str, float]:
    from comgra.analysis import Scanner
    from comgra.store import GroupReader
    from comgra.store import format as fmt

    scanner = Scanner()
    scanner.scan(group)
    unchanged = timed(lambda: scanner.scan(group), repeats)
    tensors = fmt.trial_dir(group, GroupReader(group).trials()[0]) / "tensors"
    source = sorted(tensors.glob("*.parquet"))[0]
    extra = tensors / fmt.chunk_name(999_999, 10**9, 10**9)  # steps the index does not list: read, then dropped
    shutil.copy(source, extra)
    try:
        start = time.perf_counter()
        scanner.scan(group)
        one_new_chunk = time.perf_counter() - start
    finally:
        extra.unlink()
    return {"unchanged": unchanged, "one_new_chunk": one_new_chunk, "findings": len(scanner.scan(group).findings)}


def _tab_figures(group: Path, repeats: int) -> dict[str, float]:
    """The Findings tab in a fresh service, as its callback builds it: the first render (it waits at most
    OPEN_WAIT_SECONDS for the background scanner), then the time until every finding is there, then warm."""
    from comgra.server.findings import OPEN_WAIT_SECONDS, filtered, findings_list
    from comgra.service import RecordingService

    first, complete_at, complete, cpu = [], [], [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), _cpu_seconds()
        service = RecordingService(group)
        progress = service.findings_progress(wait_seconds=OPEN_WAIT_SECONDS)
        findings_list(filtered(progress.findings, None, None, None), scanning=progress.pending)
        first.append(time.perf_counter() - start)
        complete.append(not progress.pending)
        findings_list(filtered(service.findings(), None, None, None))  # waits for the background scan
        complete_at.append(time.perf_counter() - start)
        cpu.append(_cpu_seconds() - start_cpu)
        warm = timed(lambda: findings_list(filtered(service.findings_progress().findings, None, None, None)), 3)
        service.close()
    return {"tab_first": statistics.median(first), "tab_first_complete": all(complete),
            "tab_cold": statistics.median(complete_at), "cpu_tab_cold": statistics.median(cpu), "tab_warm": warm}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/comgra-bench-scan"))
    parser.add_argument("--scale", type=float, action="append")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--full", action="store_true",
                        help="every figure at every scale (by default the 50x recording gets the cold scan and the tab)")
    parser.add_argument("--group", type=Path, action="append", default=[],
                        help="an existing group folder to measure as well (e.g. a long synthetic recording)")
    args = parser.parse_args(argv)
    results = {}
    groups = [(f"scale {scale:g}", recording(args.out, scale)) for scale in args.scale or
              ([] if args.group else [1.0, 10.0, 50.0])] + [(str(g), g) for g in args.group]
    for name, group in groups:
        results[name] = r = measure(group, args.repeats, full=args.full or "scale 50" not in name)
        lines = [f"{name}: {r['trials']} trial(s), {r['steps']} recorded steps in all"]
        if "cli" in r:
            lines.append(f"  comgra scan --json (subprocess)     {r['cli']:.2f} s wall, {r['cpu_cli']:.2f} s CPU")
        lines.append(f"  scan in process, cold               {r['cold']:.2f} s wall, {r['cpu_cold']:.2f} s CPU")
        if "unchanged" in r:
            lines += [f"  scan again, nothing new             {r['unchanged'] * 1000:.1f} ms",
                      f"  scan again, one new chunk           {r['one_new_chunk']:.2f} s ({r['findings']} findings)"]
        lines += [f"  Findings tab, first render, cold    {r['tab_first']:.2f} s "
                  f"({'every finding listed' if r['tab_first_complete'] else 'the rest still being scanned'})",
                  f"  Findings tab, every finding listed  {r['tab_cold']:.2f} s after opening cold "
                  f"({r['cpu_tab_cold']:.2f} s CPU); warm {r['tab_warm'] * 1000:.0f} ms",
                  f"  per recorded step (cold scan)       {1000 * r['cold'] / r['steps']:.3f} ms wall, "
                  f"{1000 * r['cpu_cold'] / r['steps']:.3f} ms CPU"]
        print("\n".join(lines), flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if len(results) > 1:
        low = min(results, key=lambda n: results[n]["steps"])
        print("linearity: a cold scan's time per recorded step, relative to the smallest recording")
        for name, r in sorted(results.items(), key=lambda item: item[1]["steps"]):
            base = results[low]
            print(f"  {name}: {r['steps']} steps ({r['steps'] / base['steps']:.1f}x): "
                  f"{1000 * r['cold'] / r['steps']:.3f} ms wall per step "
                  f"({(r['cold'] / r['steps']) / (base['cold'] / base['steps']):.2f}x), "
                  f"{1000 * r['cpu_cold'] / r['steps']:.3f} ms CPU per step "
                  f"({(r['cpu_cold'] / r['steps']) / (base['cpu_cold'] / base['steps']):.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

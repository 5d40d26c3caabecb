"""What page checksums cost: writing chunks with CRCs, and reading with every page checked.

Each version of comgra writes its own recording (``synthetic_recording``, the same seed and shape) and
reads it back, each in a process of its own, the versions taking turns (``--rounds``); medians are
printed side by side with their ratio:

    python benchmarks/page_checksums.py [--before REV] [--nodes 192] [--scale 0.25] [--rounds 3]

``--before`` (default: the commit before checksums, d1b15d1) is loaded from git into a temporary folder;
"after" is this working tree's ``src``. Measured:

- encode: one flushed tensors chunk (the writer's ``_encode``, lz4) and one merged one (zstd), in ms;
- first selection: a fresh reader's first ``selection(training_step=...)`` (after: checks the pages of
  every column the query reads, once per chunk), then a second step of the same chunk (checked already);
  the same for one node of a step (only the row groups that can hold the node are checked), and for the
  app's read of a whole step (``steps_selection``);
- series: a fresh reader's first series of one node across every chunk (pages it reads are checked);
- scan load: ``ChunkCache().load`` of the whole trial, what ``comgra scan`` reads.

Each figure is the median of REPEATS in the process (a fresh reader each time, the OS's file cache warm),
and the median of those over the rounds. Run it on an otherwise idle machine: other load moves these
figures by 2x and more.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BEFORE = "d1b15d1"
REPEATS = 5  # per figure, in each process: the median


def worker(nodes: int, scale: float, folder: Path) -> dict[str, float]:
    """Runs in the version's own process (its src first on sys.path)."""
    sys.path.insert(0, str(HERE))
    import synthetic_recording as synthetic

    from comgra.analysis.loading import ChunkCache
    from comgra.store import GroupReader
    from comgra.store import format as fmt
    from comgra.store import writer

    fmt.DURABLE_WRITES = False  # fsync is the disk's, not the encoder's, cost
    options = synthetic.Options(scale=scale, trials=1, nodes=nodes)
    group = folder / "group"
    synthetic.write_trial(group, "trial", 0, options)
    trial = GroupReader(group).trial("trial")
    chunks = trial.tensor_chunks()
    # The same Arrow layout in both versions (how a reader returns a chunk differs between them, and an encoder's
    # speed depends on it): one contiguous table, as the recorder hands the writer.
    import pyarrow.parquet as pq

    table = pq.read_table(chunks[0]).drop_columns(["rank"]).combine_chunks()
    figures: dict[str, float] = {}
    for name, compression in (("encode fresh (lz4)", writer.FRESH_COMPRESSION),
                              ("encode merged (zstd)", writer.MERGED_COMPRESSION)):
        times = []
        for index in range(5):
            path = folder / f"encoded-{index}.parquet"
            start = time.perf_counter()
            writer._encode("tensors", path, table, compression)
            times.append(time.perf_counter() - start)
            path.unlink()
        figures[f"{name}, ms"] = statistics.median(times) * 1e3
    steps = trial.steps()["training_step"].to_pylist()
    low, high = fmt.step_range_of(chunks[0].name)
    first_chunk = [s for s in steps if low <= s <= high]
    node = trial.selection(training_step=steps[0], columns=["node", "role"]).to_pylist()[0]

    def fresh() -> Any:  # a new reader: nothing checked or cached yet (the OS's file cache is warm)
        return GroupReader(group).trial("trial")

    def cold_then_warm() -> tuple[float, float]:
        reader = fresh()
        start = time.perf_counter()
        reader.selection(training_step=first_chunk[0])
        middle = time.perf_counter()
        reader.selection(training_step=first_chunk[1])
        return middle - start, time.perf_counter() - middle

    pairs = [cold_then_warm() for _ in range(REPEATS)]
    figures["first selection (cold chunk), ms"] = statistics.median(p[0] for p in pairs) * 1e3
    figures["second step, same chunk, ms"] = statistics.median(p[1] for p in pairs) * 1e3
    figures["first node of a step (cold chunk), ms"] = _median_ms(
        lambda: fresh().selection(training_step=first_chunk[0], node=node["node"]))
    figures["app's whole-step read (cold chunk), ms"] = _median_ms(
        lambda: fresh().steps_selection([first_chunk[0]]))
    figures["first series, ms"] = _median_ms(lambda: fresh().series(node=node["node"], role=node["role"], iteration=0))
    figures["scan load, ms"] = _median_ms(lambda: ChunkCache().load(fresh()))
    figures["chunks"] = len(chunks)
    figures["tensor MB on disk"] = sum(p.stat().st_size for p in chunks) / 2**20
    assert not fresh().problems
    return figures


def _median_ms(call: Any) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def run_version(src: Path, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="comgra-crc-") as folder:
        out = subprocess.run([sys.executable, __file__, "--worker", str(folder), "--nodes", str(args.nodes),
                              "--scale", str(args.scale)], env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default=BEFORE)
    parser.add_argument("--nodes", type=int, default=192)
    parser.add_argument("--scale", type=float, default=0.25)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", type=Path)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.nodes, args.scale, args.worker)))
        return
    with tempfile.TemporaryDirectory(prefix="comgra-before-") as before:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before, "src"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
        results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for _ in range(args.rounds):
            results["before"].append(run_version(Path(before) / "src", args))
            results["after"].append(run_version(ROOT / "src", args))
    print(f"{args.nodes} nodes, scale {args.scale}, {args.rounds} rounds (median); before = {args.before}, "
          f"after = this tree")
    print(f"{'':38} {'before':>10} {'after':>10} {'after/before':>13}")
    for key in results["after"][0]:
        b = statistics.median(r[key] for r in results["before"])
        a = statistics.median(r[key] for r in results["after"])
        print(f"{key:38} {b:10.2f} {a:10.2f} {a / b if b else float('nan'):12.2f}x")


if __name__ == "__main__":
    main()

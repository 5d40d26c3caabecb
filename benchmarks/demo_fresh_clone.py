"""How long the README's quick start takes from a fresh clone: ``comgra demo``, install excluded and included.

    python benchmarks/demo_fresh_clone.py [--rounds 2] [--steps 300] [--no-install]

Clones this repository's HEAD into a temporary folder (a fresh clone: no build, no recording, no saved
findings), then, alternating the variants round by round so that the machine's load hits both alike:

- *demo*: the clone's ``comgra demo --port 0`` with an existing environment (this interpreter, the clone's
  ``src`` first on the path);
- *install + demo*: ``python3 -m venv`` and the README's main-job line (``pip install torch==2.13.0 -e .``)
  in the clone, then its ``.venv/bin/comgra demo --port 0``. pip's cache is used as it is (on the machines
  this was measured on it holds the wheels already: downloads are not measured).

For each it records three moments from the start: the app answers its address (*served*), the findings
are ready (``GET /api/v1/findings`` answers: the "Start here" strip can show), and for the install variant
the end of the install. It prints the medians and the ratio of the variants.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INSTALL = ["install", "-q", "torch==2.13.0", "-e", "."]  # the README's main-job line, without the demo


def clone(into: Path) -> Path:
    target = into / "comgra"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(target)], check=True)
    subprocess.run(["git", "-C", str(target), "checkout", "-q", subprocess.check_output(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], text=True).strip()], check=True)
    return target


def run_demo(command: list[str], *, cwd: Path, env: dict[str, str], root: Path, steps: int) -> dict[str, float]:
    """Start the demo, wait until it serves and until its findings are ready; seconds from the start."""
    start = time.perf_counter()
    process = subprocess.Popen([*command, "demo", "--path", str(root), "--port", "0", "--steps", str(steps)],
                               cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        assert process.stdout is not None
        url = None
        for line in process.stdout:
            match = re.search(r"comgra: open (http://[^\s?]+?)/?(?:\?\S*)? in a browser", line)
            if match:
                url = match.group(1)
                break
        if url is None:
            raise RuntimeError(f"the demo ended without serving (exit {process.wait()})")
        with urllib.request.urlopen(url + "/", timeout=120) as response:
            assert response.status == 200
        served = time.perf_counter() - start
        with urllib.request.urlopen(url + "/api/v1/findings", timeout=600) as response:
            findings = json.load(response)
        ready = time.perf_counter() - start
        first = next((f for t in findings["findings"] for f in t["findings"]), None)
        return {"served": served, "findings": ready, "first_finding": first["node"] if first else None}
    finally:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def demo_only(source: Path, work: Path, steps: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(source / "src"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "")}
    env = {k: v for k, v in env.items() if v != ""}
    return run_demo([sys.executable, "-m", "comgra.cli.app"], cwd=source, env=env, root=work, steps=steps)


def install_and_demo(source: Path, work: Path, steps: int) -> dict[str, float]:
    start = time.perf_counter()
    venv = source / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    installed = subprocess.run([str(venv / "bin" / "pip"), *INSTALL], cwd=source, capture_output=True, text=True)
    if installed.returncode:
        raise RuntimeError(f"pip failed:\n{installed.stdout[-2000:]}{installed.stderr[-2000:]}")
    install_seconds = time.perf_counter() - start
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    times = run_demo([str(venv / "bin" / "comgra")], cwd=source, env=env, root=work, steps=steps)
    return {"install": install_seconds,
            **{k: v + install_seconds if isinstance(v, float) else v for k, v in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300, help="comgra demo --steps (default: the demo's default)")
    parser.add_argument("--no-install", action="store_true", help="measure only the demo with an installed comgra")
    parser.add_argument("--compare-steps", type=int, default=None,
                        help="also the demo with this many steps (e.g. 1500, the default before), interleaved")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"demo": [], "install + demo": []}
    other = f"demo --steps {args.compare_steps}"
    if args.compare_steps:
        results[other] = []
    with tempfile.TemporaryDirectory(prefix="comgra-fresh-") as folder:
        source = clone(Path(folder))
        print(f"fresh clone of {REPO} at {source}; load average {os.getloadavg()[0]:.1f}; {os.cpu_count()} CPUs",
              flush=True)
        for round_ in range(args.rounds):
            variants = [("demo", demo_only)] + ([] if args.no_install else [("install + demo", install_and_demo)])
            if args.compare_steps:
                variants.append((other, lambda source, work, _: demo_only(source, work, args.compare_steps)))
            if round_ % 2:
                variants.reverse()
            for name, variant in variants:
                work = Path(folder) / f"run-{round_}-{len(results[name])}-{name.replace(' ', '')}"
                times = variant(source, work, args.steps)
                results[name].append(times)
                print(f"round {round_ + 1} {name}: " + ", ".join(
                    f"{k} {v:.1f} s" if isinstance(v, float) else f"{k} {v}" for k, v in times.items())
                    + f" (load {os.getloadavg()[0]:.1f})", flush=True)
    print(f"\nmedians over {args.rounds} round(s), --steps {args.steps}:")
    medians = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], float)}
               for name, runs in results.items() if runs}
    for name, values in medians.items():
        print(f"  {name:15} " + ", ".join(f"{k} {v:.1f} s" for k, v in values.items()))
    for name in medians:
        if name != "demo":
            print(f"  {name} / demo, to the findings: {medians[name]['findings'] / medians['demo']['findings']:.2f}x")


if __name__ == "__main__":
    main()

"""The healthy corpus's quick subset (``benchmarks/healthy_corpus.py --quick``), run as a user runs it: a fresh
process records runs shaped like what people train (a ResNet on clamped normalised images, a ViT with evaluation
passes, GPT-2 with padding masks, a Llama fine-tuned at 1e-5 with warm-up and decay, a LoRA GPT-2 with its base
frozen, an MNIST-style MLP at chance for its first steps, the Trainer and Lightning callbacks) and scans each: no
run gets a warning, and the JSON it writes says what the scan found."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("lightning")

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "healthy_corpus.py"


def test_the_quick_healthy_corpus_gets_no_warning(tmp_path: Path) -> None:
    out = tmp_path / "corpus.json"
    done = subprocess.run([sys.executable, str(BENCHMARK), "--quick", "--steps", "44", "--json", str(out)],
                          capture_output=True, text=True, timeout=1500)
    result = json.loads(out.read_text())
    runs = {o["run"]: o for o in result["outcomes"]}
    assert len(runs) >= 8 and not [o["error"] for o in runs.values() if o["error"]], done.stdout[-3000:]
    assert all(o["scan_seconds"] > 0 for o in runs.values())  # every run was scanned
    loud = {name: [f"{w['detector']}@{w['node']}: {w['message']}" for w in o["warnings"]] for name, o in runs.items()
            if o["warnings"]}
    assert not loud, loud
    assert done.returncode == 0 and "TARGET runs with any warning: 0 of" in done.stdout
    frozen = [o for o in runs.values() if o["run"] == "gpt2_lora"][0]
    assert frozen["infos"] < 10  # the frozen base is one finding, not one per tensor

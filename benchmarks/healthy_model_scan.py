"""A healthy real model of a few hundred nodes, recorded with comgra and scanned: no finding at warning or above.

A GPT-2 from transformers, built from a small config (12 blocks, width 64), learns a synthetic task it
can learn (the next token of sequences that follow a fixed random successor table), with Adam, as one
trains it normally. Every parameter is tracked (``track_module``) and every block's sub-layers'
outputs are registered through forward hooks, so the recording has a few hundred nodes. Then
``comgra scan --json`` runs on it in a fresh process and the script prints the findings by severity:
the target is none at warning or above.

    python benchmarks/healthy_model_scan.py --out /tmp/healthy --steps 300 --record-every 3
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

GROUP, TRIAL = "healthy_gpt2", "adam"
VOCAB, LENGTH = 64, 32


def build(layers: int, width: int, seed: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=width, n_layer=layers, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def batch_of(successor: torch.Tensor, batch: int, generator: torch.Generator) -> torch.Tensor:
    """Sequences that follow ``successor`` from a random first token: the next token is learnable."""
    tokens = [torch.randint(0, VOCAB, (batch,), generator=generator)]
    for _ in range(LENGTH):
        tokens.append(successor[tokens[-1]])
    return torch.stack(tokens, dim=1)


def sublayers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The modules whose outputs are registered: each block's sub-layers, the block, the final norm."""
    named = {"ln_f": model.transformer.ln_f}
    for index, block in enumerate(model.transformer.h):
        for part in ("ln_1", "attn", "ln_2", "mlp.c_fc", "mlp.act", "mlp.c_proj"):
            named[f"h{index}.{part}"] = block.get_submodule(part)
        named[f"h{index}"] = block
    return named


def record(out: Path, steps: int, record_every: int, layers: int, width: int, batch: int, seed: int) -> dict:
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    model = build(layers, width, seed)
    generator = torch.Generator().manual_seed(seed)
    successor = torch.randperm(VOCAB, generator=generator)
    recorder = ComgraRecorder(out, GROUP, TRIAL, DecisionMakerForRecordingsHardcoded(set(range(0, steps, record_every))),
                              max_num_batch_size_to_record=8)
    recorder.track_module("gpt2", model)
    hooks = [module.register_forward_hook(
        lambda module, args, output, name=name: recorder.register_tensor(
            name, output[0] if isinstance(output, tuple) else output)) for name, module in sublayers(model).items()]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    start = time.perf_counter()
    try:
        for step in range(steps):
            tokens = batch_of(successor, batch, generator)
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            recorder.start_batch(step, batch)
            recorder.start_iteration()
            embedded = model.transformer.wte(inputs)
            recorder.register_tensor("tokens_embedded", embedded, is_input=True)
            logits = model(inputs_embeds=embedded).logits
            recorder.register_tensor("logits", logits)
            per_token = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="none")
            per_sample = per_token.reshape(batch, LENGTH).mean(dim=1, keepdim=True)
            recorder.register_tensor("loss_per_sample", per_sample)
            loss = per_sample.mean()
            recorder.register_tensor("loss", loss, is_loss=True)
            optimizer.zero_grad()
            loss.backward()
            recorder.record_current_gradients("gradients")
            recorder.finish_iteration()
            optimizer.step()
            recorder.finish_batch()
            losses.append(float(loss.detach()))
    finally:
        for hook in hooks:
            hook.remove()
        recorder.finalize()
    return {"seconds": time.perf_counter() - start, "first_loss": losses[0], "last_loss": sum(losses[-10:]) / 10,
            "parameters": sum(1 for _ in model.parameters())}


def scan(group: Path) -> dict:
    """``comgra scan --json`` in a fresh process, as a user runs it."""
    start = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).parent / "comgra"), "scan", "--path", str(group), "--json"],
                          capture_output=True, text=True, check=True)
    return {"seconds": time.perf_counter() - start, **json.loads(done.stdout)}


def nodes_of(group: Path) -> int:
    graphs = list((group / "trials" / TRIAL / "graphs").glob("*.json"))
    return max(len(json.loads(p.read_text()).get("nodes", [])) for p in graphs) if graphs else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="an empty folder for the recording")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--record-every", type=int, default=3)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    trained = record(args.out, args.steps, args.record_every, args.layers, args.width, args.batch, args.seed)
    group = args.out / GROUP
    scanned = scan(group)
    findings = scanned["findings"]
    print(f"recorded {args.steps} steps (one in {args.record_every}) of GPT-2 ({args.layers} blocks, width "
          f"{args.width}, {trained['parameters']} parameter tensors) in {trained['seconds']:.1f} s; "
          f"loss {trained['first_loss']:.3f} -> {trained['last_loss']:.3f}; graph nodes: {nodes_of(group)}")
    print(f"comgra scan --json: {scanned['seconds']:.1f} s, findings by severity: "
          f"{dict(Counter(f['severity'] for f in findings))}, by detector: {dict(Counter(f['detector'] for f in findings))}")
    loud = [f for f in findings if f["severity"] in ("error", "warning")]
    for finding in loud:
        print(f"  {finding['severity']} {finding['detector']} {finding['node']}: {finding['message']}")
    print(f"TARGET findings at warning or above: {len(loud)} (target 0): {'met' if not loud else 'NOT met'}")
    return 0 if not loud else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""One rank of a 2-rank torchrun ``transformers.Trainer`` run (gloo, CPU) with comgra's ``ComgraCallback``.

Usage: trainer_ddp_worker.py ROOT OUT ACCUMULATION. Writes OUT/expected-r<rank>.json: for each optimizer step, the
statistics of one parameter's gradient as the optimizer gets it, all-reduced by DDP and not yet clipped (read
where the Trainer clips, which it does with ``max_grad_norm`` small enough that clipping changes every step).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers

from comgra.integrations.transformers import ComgraCallback
from comgra.objects import DecisionMakerForRecordingsHardcoded

PARAMETER = "transformer.h.0.mlp.c_fc.weight"


def main() -> None:
    root, out, accumulation = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    transformers.utils.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=32, n_positions=16, bos_token_id=0,
                                     eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 32, (48, 6), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = transformers.TrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=4, gradient_accumulation_steps=accumulation,
        max_steps=4, learning_rate=0.1, optim="sgd", lr_scheduler_type="constant", use_cpu=True, ddp_backend="gloo",
        report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0, max_grad_norm=1e-4)
    callback = ComgraCallback(root, "group", "trial", DecisionMakerForRecordingsHardcoded({0, 1, 2, 3}),
                              flush_seconds=0.05)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    expected: dict[int, dict[str, float]] = {}
    clip = trainer.accelerator.clip_grad_norm_

    def clip_and_remember(parameters, *arguments, **options):  # type: ignore[no-untyped-def]
        parameters = list(parameters)
        grad = dict(trainer.model.named_parameters())
        weight = grad.get(PARAMETER, grad.get("module." + PARAMETER))
        assert weight is not None and weight.grad is not None
        g = weight.grad.detach().double()
        expected[trainer.state.global_step] = {"abs_mean": float(g.abs().mean()), "abs_max": float(g.abs().max()),
                                              "std": float(g.std(unbiased=False))}
        return clip(parameters, *arguments, **options)

    trainer.accelerator.clip_grad_norm_ = clip_and_remember  # type: ignore[method-assign]
    trainer.train()
    rank = torch.distributed.get_rank()
    (out / f"expected-r{rank}.json").write_text(json.dumps(expected))


if __name__ == "__main__":
    main()

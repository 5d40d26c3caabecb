"""The runs of the healthy corpus, by name: each records one trial into ``root/healthy`` and trains something
people train, the way they train it. None has a bug: any warning the scan gives on one is a false alarm."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from healthy import models
from healthy.loop import Context, Plan, train

IMAGE_BATCH, TOKEN_BATCH = 16, 8


@dataclass(frozen=True)
class Spec:
    name: str
    run: Callable[[Context], Any]
    quick: bool = False  # in the --quick subset the suite runs


# -- images ----------------------------------------------------------------------------------------------------

def image_run(ctx: Context, arch: str, recipe: str) -> None:
    torch.manual_seed(ctx.seed)
    model = models.image_model(arch)
    data = models.Images(ctx.generator)
    if recipe == "full_bf16":
        model = model.to(torch.bfloat16)

    def loss_of(m: torch.nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(m(x.to(next(m.parameters()).dtype)).float(), y)
    lr = 0.05 if recipe == "sgd" else 1e-3
    optimizer = (torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4) if recipe == "sgd"
                 else torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05))
    plan = Plan(optimizer, scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, ctx.steps))
    if recipe == "eval":
        plan.eval_every = 5
    elif recipe == "accumulate":
        plan.accumulate = 2
    elif recipe == "autocast_bf16":
        plan.autocast = torch.bfloat16
    elif recipe == "amp_scaler":
        plan.autocast, plan.scaler = torch.float16, torch.amp.GradScaler("cpu")
    train(ctx, model, lambda: data.batch(IMAGE_BATCH), loss_of, plan)


# -- transformers ----------------------------------------------------------------------------------------------

def token_batch(kind: str, data: models.Tokens, generator: torch.Generator) -> dict[str, torch.Tensor]:
    batch = data.batch(TOKEN_BATCH)
    if kind == "bert":  # masked language modelling: 15% of the real tokens masked, only they are predicted
        masked = (torch.rand(batch["input_ids"].shape, generator=generator) < 0.15) & (batch["attention_mask"] > 0)
        batch["labels"] = batch["input_ids"].masked_fill(~masked, -100)
        batch["input_ids"] = batch["input_ids"].masked_fill(masked, data.vocab - 1)
    elif kind == "t5":  # the successor of each token, a sequence to sequence task
        batch["labels"] = torch.where(batch["labels"] > 0, data.successor[(batch["input_ids"] - 1).clamp(min=0)],
                                      batch["labels"])
    elif kind == "whisper":  # features that encode the tokens; the decoder writes the tokens
        ids = batch.pop("input_ids")
        batch.pop("attention_mask")
        table = torch.randn(data.vocab, 16, generator=torch.Generator().manual_seed(7))
        features = table[ids].transpose(1, 2)  # (batch, mel bins, frames)
        batch = {"input_features": torch.cat([features, features], dim=2), "labels": ids}
    return batch


def generate_of(kind: str) -> Callable[[torch.nn.Module, Any], None]:
    def generate(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> None:
        if kind == "whisper":
            model.generate(input_features=batch["input_features"][:2], max_new_tokens=4, do_sample=False)
        else:
            model.generate(input_ids=batch["input_ids"][:2, :4], attention_mask=batch["attention_mask"][:2, :4],
                           max_new_tokens=4, do_sample=False)
    return generate


def language_run(ctx: Context, kind: str, recipe: str) -> None:
    from transformers import get_linear_schedule_with_warmup

    torch.manual_seed(ctx.seed)
    model = models.language_model(kind)
    data = models.Tokens(ctx.generator, pad=recipe == "padded")
    if recipe == "lora":
        model = models.add_lora(model, ("c_attn", "q_proj", "v_proj", "q", "v", "query", "value"))
    if recipe == "full_bf16":
        model = model.to(torch.bfloat16)
    fine_tune = recipe == "finetune"
    lr = 1e-5 if fine_tune else 1e-3
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, ctx.steps // 10, ctx.steps)
    plan = Plan(optimizer, scheduler=scheduler)
    if fine_tune:  # "pretrained": trained at 1e-3 before the recorded fine-tuning at 1e-5
        pretrain = torch.optim.AdamW(model.parameters(), lr=1e-3)
        plan.optimizer = pretrain
        plan.unrecorded_warmup = 40
    if recipe in ("eval_generate", "eval"):
        plan.eval_every = 5
        plan.generate = generate_of(kind) if recipe == "eval_generate" else None
    elif recipe == "accumulate":
        plan.accumulate = 2
    elif recipe == "autocast_bf16":
        plan.autocast = torch.bfloat16
    batch = functools.partial(token_batch, kind, data, ctx.generator)
    if fine_tune:
        for _ in range(plan.unrecorded_warmup):
            pretrain.zero_grad()
            model(**batch()).loss.backward()
            pretrain.step()
        plan.optimizer, plan.unrecorded_warmup = optimizer, 0
    train(ctx, model, batch, lambda m, b: m(**b).loss, plan)


# -- small classifiers -----------------------------------------------------------------------------------------

def mnist_run(ctx: Context, recipe: str) -> None:
    torch.manual_seed(ctx.seed)
    model = models.mlp(14 * 14, 64, 10)
    templates = models.mnist_like(ctx.generator, 1)[2]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05) if recipe != "adam" else \
        torch.optim.Adam(model.parameters(), lr=1e-3)
    plan = Plan(optimizer, clip=None)
    if recipe == "plateau":  # plain SGD at a small learning rate: near chance for the first part of the run
        plan.optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x, y, _ = models.mnist_like(ctx.generator, 32, templates=templates)
        return x, y
    train(ctx, model, batch, lambda m, b: F.cross_entropy(m(b[0]), b[1]), plan)


# -- the corpus --------------------------------------------------------------------------------------------------

def _specs() -> list[Spec]:
    from healthy import integrations

    specs = []
    for arch in ("resnet", "mobilenet", "vit"):
        for recipe in ("sgd", "adamw", "eval", "accumulate", "autocast_bf16", "amp_scaler"):
            specs.append(Spec(f"{arch}_{recipe}", functools.partial(image_run, arch=arch, recipe=recipe),
                              quick=(arch, recipe) in (("resnet", "sgd"), ("vit", "eval"))))
    specs.append(Spec("vit_full_bf16", functools.partial(image_run, arch="vit", recipe="full_bf16")))
    for kind in ("gpt2", "llama", "bert", "t5", "whisper"):
        for recipe in ("plain", "padded" if kind != "whisper" else "accumulate", "finetune",
                       "eval_generate" if kind != "bert" else "eval"):
            specs.append(Spec(f"{kind}_{recipe}", functools.partial(language_run, kind=kind, recipe=recipe),
                              quick=(kind, recipe) in (("gpt2", "padded"), ("llama", "finetune"))))
    for kind, recipe in (("gpt2", "lora"), ("llama", "lora"), ("t5", "lora"), ("gpt2", "full_bf16"),
                         ("llama", "full_bf16"), ("gpt2", "autocast_bf16"), ("llama", "accumulate")):
        specs.append(Spec(f"{kind}_{recipe}", functools.partial(language_run, kind=kind, recipe=recipe),
                          quick=recipe == "lora" and kind == "gpt2"))
    for recipe in ("sgd", "adam", "plateau"):
        specs.append(Spec(f"mnist_{recipe}", functools.partial(mnist_run, recipe=recipe), quick=recipe == "plateau"))
    specs += integrations.SPECS
    return specs


SPECS = _specs()

"""Runs of the healthy corpus recorded by the integrations: the transformers Trainer callback, the Lightning
callback, and a DDP run on 2 ranks (torchrun, gloo) recorded by every rank."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from healthy import models
from healthy.loop import GROUP, Context

HERE = Path(__file__).resolve().parent


def _schedule(ctx: Context) -> Any:
    from comgra.objects import DecisionMakerForRecordingsHardcoded

    return DecisionMakerForRecordingsHardcoded(set(range(0, 4 * ctx.steps, ctx.every)))


def trainer_run(ctx: Context, kind: str) -> None:
    import transformers

    from comgra.integrations.transformers import ComgraCallback

    torch.manual_seed(ctx.seed)
    model = models.language_model(kind)
    data = models.Tokens(ctx.generator, pad=kind == "bert")
    from healthy.runs import token_batch

    rows = []
    for _ in range(ctx.steps):
        batch = token_batch(kind, data, ctx.generator)
        rows += [{key: value[i] for key, value in batch.items()} for i in range(len(batch["labels"]))]
    evaluation = rows[: 4 * 8] if kind == "bert" else None
    args = transformers.TrainingArguments(
        output_dir=str(ctx.root / "trainer_out" / ctx.trial), per_device_train_batch_size=8, per_device_eval_batch_size=8,
        max_steps=ctx.steps, learning_rate=1e-3, warmup_steps=ctx.steps // 10, lr_scheduler_type="linear",
        use_cpu=True, report_to=[], save_strategy="no", logging_steps=10, disable_tqdm=True, seed=ctx.seed,
        eval_strategy="steps" if evaluation else "no", eval_steps=10)
    callback = ComgraCallback(ctx.root, GROUP, ctx.trial, _schedule(ctx), resource_seconds=None, flush_seconds=30.0,
                              max_num_batch_size_to_record=8)
    transformers.Trainer(model=model, args=args, train_dataset=rows, eval_dataset=evaluation,
                         callbacks=[callback]).train()


def lightning_run(ctx: Context, kind: str) -> None:
    import lightning

    from comgra.integrations.lightning import ComgraCallback

    torch.manual_seed(ctx.seed)

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = models.image_model("resnet") if kind == "resnet" else models.mlp(14 * 14, 64, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            return F.cross_entropy(self(batch[0]), batch[1])

        def validation_step(self, batch: Any, index: int) -> torch.Tensor:
            return F.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    if kind == "resnet":
        images = models.Images(ctx.generator)
        x, y = zip(*(images.batch(16) for _ in range(ctx.steps)))
    else:
        templates = models.mnist_like(ctx.generator, 1)[2]
        x, y = zip(*(models.mnist_like(ctx.generator, 32, templates=templates)[:2] for _ in range(ctx.steps)))
    data = torch.utils.data.TensorDataset(torch.cat(x), torch.cat(y))
    loader = torch.utils.data.DataLoader(data, batch_size=len(x[0]))
    validation = torch.utils.data.DataLoader(torch.utils.data.Subset(data, range(64)), batch_size=len(x[0]))
    callback = ComgraCallback(ctx.root, GROUP, ctx.trial, _schedule(ctx), resource_seconds=None, flush_seconds=30.0,
                              max_num_batch_size_to_record=8)
    trainer = lightning.Trainer(default_root_dir=str(ctx.root / "lightning_out"), accelerator="cpu", devices=1,
                                logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, num_sanity_val_steps=0, max_epochs=1,
                                val_check_interval=20, callbacks=[callback])
    trainer.fit(Module(), loader, validation)


def ddp_run(ctx: Context) -> None:
    """torchrun --nproc_per_node=2 of ``ddp_worker.py`` (gloo on CPU): a ResNet-shaped model under DDP."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(HERE / "ddp_worker.py"), str(ctx.root), ctx.trial, str(ctx.steps), str(ctx.every)],
                          capture_output=True, text=True, env=env, timeout=600)
    if done.returncode:
        raise RuntimeError(f"torchrun failed ({done.returncode}):\n{done.stderr[-3000:]}")


SPECS = []


def _add() -> None:
    from healthy.runs import Spec

    SPECS.extend([
        Spec("trainer_gpt2", functools.partial(trainer_run, kind="gpt2"), quick=True),
        Spec("trainer_bert_eval", functools.partial(trainer_run, kind="bert")),
        Spec("lightning_resnet", functools.partial(lightning_run, kind="resnet")),
        Spec("lightning_mlp", functools.partial(lightning_run, kind="mlp"), quick=True),
        Spec("ddp_resnet_2_ranks", ddp_run),
    ])


_add()

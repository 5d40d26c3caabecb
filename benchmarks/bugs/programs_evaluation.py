"""Evaluation-phase bugs issue 32 found still missed, written from the bug's public description (not from a test of
ours): dropout applied through the functional interface, which stays on after ``model.eval()``."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import comgra
from bugs.harness import Case, Run, blobs, cross_entropy


class _Block(torch.nn.Module):
    """A linear layer, GELU, and dropout written the functional way."""

    def __init__(self, width_in: int, width_out: int, p: float, bug: bool) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width_in, width_out)
        self.p = p
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc(x))
        if self.bug:  # "F.dropout's training argument defaults to True": dropout stays on after model.eval()
            return F.dropout(h, self.p)
        return F.dropout(h, self.p, training=self.training)


def functional_dropout_in_evaluation(run: Run, bug: bool) -> None:
    """'Validation accuracy changes every time I evaluate the same model' (PyTorch forum): a block calls
    ``F.dropout(h, self.p)`` in its forward; ``F.dropout``'s ``training`` argument defaults to True, so the block
    drops a fraction p of its values on every evaluation pass too, though ``model.eval()`` was called. The fix:
    ``F.dropout(h, self.p, training=self.training)`` (or an ``nn.Dropout`` module)."""
    torch.manual_seed(run.seed)
    model = torch.nn.Sequential(_Block(8, 64, 0.3, bug), _Block(64, 64, 0.3, bug), torch.nn.Linear(64, 4))
    batches = blobs(run)
    watch = comgra.watch(model, recorder=run.recorder, name="model")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    try:
        for step in range(run.steps):
            x, y = batches(step)
            evaluation = step % 5 == 4
            model.train(not evaluation)
            with run.step(step, x.shape[0], "evaluation" if evaluation else "train"):
                run.recorder.register_tensor("input", x, is_input=True)
                run.recorder.register_tensor("target", y, is_target=True)
                with torch.set_grad_enabled(not evaluation):
                    loss = cross_entropy(model(x), y)
                    run.recorder.register_tensor("loss", loss, is_loss=True)
                if not evaluation:
                    optimizer.zero_grad()
                    loss.backward()
                    run.recorder.record_current_gradients("gradients")
            if not evaluation:
                optimizer.step()
    finally:
        watch.remove()


CASES = [
    Case("functional_dropout_in_evaluation", functional_dropout_in_evaluation,
         "PyTorch forum: F.dropout(x, p) in forward stays on after model.eval() (training defaults to True)",
         ("model.0", "model.1"), ("run_modes",), architecture="MLP"),
]

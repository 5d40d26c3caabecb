"""Lost or zeroed data (issue 32): inputs, labels or masks zeroed in transit on some steps, mostly ones the policy does
not record, each written from the bug's public description (not from a test of ours). The every-step sentinels watch
the inputs; the scan's ``input_collapsed`` names the input and the steps."""
from __future__ import annotations

import torch
from torch import nn

import comgra
from bugs.harness import Case, Run, cross_entropy, supervised


def collate_zeroes_unreadable_batches(run: Run, bug: bool) -> None:
    """'Loss spikes every few hundred iterations' (forum): the dataset's ``__getitem__`` catches a decoding error and
    returns ``torch.zeros`` in place of the image, and one shard of the data is unreadable, so every batch drawn from
    it is all zeros (1 step in 9 here). The fixed twin skips the unreadable samples (a batch from another shard)."""
    torch.manual_seed(run.seed)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                          nn.Linear(32, 4))
    templates = torch.randn(4, 3, 8, 8, generator=run.generator)
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = run.randint(4, 16)
        images = (templates[y] + 0.5 * run.randn(16, 3, 8, 8)).sigmoid()  # pixels in [0, 1]
        if bug and step % 9 == 5:  # the unreadable shard: every __getitem__ returned torch.zeros(3, 8, 8)
            images = torch.zeros_like(images)
        return ((images - mean) / std).clamp(-3, 3) if not (bug and step % 9 == 5) else images, y
    supervised(run, model, batch_of, cross_entropy, lr=1e-2)


class _TinyEncoder(nn.Module):
    """Token classification with an attention mask, called as a transformers model is: ids, mask, labels."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.attention = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, 4)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        bias = (1.0 - attention_mask[:, None, :].float()) * -1e4  # the additive mask, as transformers builds it
        bias = bias.repeat_interleave(4, dim=0).expand(-1, input_ids.shape[1], -1)
        hidden = hidden + self.attention(hidden, hidden, hidden, attn_mask=bias, need_weights=False)[0]
        return cross_entropy(self.head(hidden).flatten(0, 1), labels.flatten())


def attention_mask_zeros_on_unpadded_batches(run: Run, bug: bool) -> None:
    """An attention mask all zeros (forum: 'model does not learn on some batches'): the collate function pads to the
    longest sequence and builds the mask from the padding it added, ``torch.zeros_like(ids)`` filled with ones up to
    each length; on a batch that needed no padding its branch returns the zeros unfilled. The model attends to
    nothing it should on those steps (a third here). The fixed twin fills the mask on every batch."""
    torch.manual_seed(run.seed)
    model = _TinyEncoder()
    watch = comgra.watch(model, recorder=run.recorder, name="model")
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    try:
        for step in range(run.steps):
            ids = run.randint(63, 8, 16) + 1
            labels = (ids + ids.roll(1, dims=1)) % 4
            mask = torch.zeros_like(ids)
            padded = step % 3 != 0
            lengths = (run.randint(8, 8) + 8) if padded else torch.full((8,), 16)
            if padded or not bug:
                for row, length in enumerate(lengths.tolist()):
                    mask[row, :length] = 1
            ids = ids * mask if padded else ids  # the padding token is 0
            with run.step(step, 8):
                loss = model(ids, attention_mask=mask, labels=labels)
                optimizer.zero_grad()
                loss.backward()
                run.recorder.record_current_gradients("gradients")
            optimizer.step()
    finally:
        watch.remove()


CASES = [
    Case("collate_zeroes_unreadable_batches", collate_zeroes_unreadable_batches,
         "Forum: loss spikes every few hundred iterations; __getitem__ returns torch.zeros on a decoding error",
         ("input",), ("sentinel_events",), architecture="CNN"),
    Case("attention_mask_zeros_on_unpadded_batches", attention_mask_zeros_on_unpadded_batches,
         "Forum: model does not learn on some batches; a collate function's mask left all zeros on unpadded batches",
         ("model.input[attention_mask]",), ("sentinel_events",), architecture="Transformer"),
]

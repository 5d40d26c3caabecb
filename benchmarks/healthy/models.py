"""The models and data of the healthy corpus: image models written here (no torchvision) on generated images
normalised per channel and clamped as real pipelines do, transformers models from small configs on synthetic
tokens, a LoRA adapter, and an MNIST-style MLP. Every task is learnable, so a healthy run learns."""
from __future__ import annotations

import math

import torch
from torch import nn

MEAN, STD = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])  # ImageNet's, as usual


# -- data ------------------------------------------------------------------------------------------------------

class Images:
    """Class-dependent images: a class template plus noise, quantised to uint8 (pixels saturate at 0 and 255, as
    in photos), then ToTensor (/255), Normalize(mean, std) per channel and clamped: the per-sample maximum is the
    same for every image (the brightest pixel of each reaches 255)."""

    def __init__(self, generator: torch.Generator, classes: int = 4, size: int = 16, channels: int = 3):
        self.generator, self.classes, self.size, self.channels = generator, classes, size, channels
        self.templates = torch.rand(classes, channels, size, size, generator=generator) * 255

    def batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randint(0, self.classes, (n,), generator=self.generator)
        noise = torch.randn(n, self.channels, self.size, self.size, generator=self.generator) * 60
        pixels = (self.templates[labels] + noise).clamp(0, 255).round().to(torch.uint8)
        x = pixels.float() / 255
        mean, std = MEAN[: self.channels].view(1, -1, 1, 1), STD[: self.channels].view(1, -1, 1, 1)
        return ((x - mean) / std).clamp(-2.5, 2.5), labels


class Tokens:
    """Sequences that follow a fixed random successor table (the next token is learnable), optionally padded at
    the end to random lengths with an attention mask (0 on padding) and labels -100 there."""

    def __init__(self, generator: torch.Generator, vocab: int = 64, length: int = 16, pad: bool = False):
        self.generator, self.vocab, self.length, self.pad = generator, vocab, length, pad
        self.successor = torch.randperm(vocab - 1, generator=generator) + 1  # token 0 is the padding

    def batch(self, n: int) -> dict[str, torch.Tensor]:
        tokens = [torch.randint(1, self.vocab, (n,), generator=self.generator)]
        for _ in range(self.length - 1):
            tokens.append(self.successor[tokens[-1] - 1])
        ids = torch.stack(tokens, dim=1)
        mask = torch.ones_like(ids)
        if self.pad:
            lengths = torch.randint(self.length // 2, self.length + 1, (n,), generator=self.generator)
            mask = (torch.arange(self.length)[None] < lengths[:, None]).long()
            ids = ids * mask
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def mnist_like(generator: torch.Generator, n: int, classes: int = 10, side: int = 14,
               templates: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Digit-like images: sparse strokes (most pixels exactly 0, as MNIST's), normalised by MNIST's mean and std."""
    if templates is None:
        templates = (torch.rand(classes, side * side, generator=generator) > 0.8).float()
    labels = torch.randint(0, classes, (n,), generator=generator)
    keep = (torch.rand(n, side * side, generator=generator) > 0.2).float()
    x = templates[labels] * keep
    return (x - 0.1307) / 0.3081, labels, templates


# -- image models ----------------------------------------------------------------------------------------------

class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """ResNet-shaped: a stem, residual BasicBlocks in stages, global pooling, a linear head."""

    def __init__(self, classes: int = 4, width: int = 16, stages: int = 2):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        blocks, cin = [], width
        for stage in range(stages):
            cout = width * 2 ** stage
            blocks += [BasicBlock(cin, cout, 1 if stage == 0 else 2), BasicBlock(cout, cout)]
            cin = cout
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.layers(self.stem(x))).flatten(1))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4):
        super().__init__()
        hidden = cin * expand
        self.use_residual = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.use_residual else self.block(x)


class MobileNet(nn.Module):
    """MobileNetV2-shaped: inverted residuals with depthwise convolutions, ReLU6, dropout before the head."""

    def __init__(self, classes: int = 4):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
            InvertedResidual(16, 16, 1), InvertedResidual(16, 24, 2), InvertedResidual(24, 24, 1),
            nn.Conv2d(24, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU6())
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(64, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean(dim=(2, 3)))


class ViT(nn.Module):
    """ViT-shaped: patch embedding, a class token, learned positions, pre-norm encoder blocks, a head on the token."""

    def __init__(self, classes: int = 4, size: int = 16, patch: int = 4, width: int = 32, depth: int = 2):
        super().__init__()
        self.patch = nn.Conv2d(3, width, patch, patch)
        count = (size // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.position = nn.Parameter(torch.randn(1, count + 1, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, 4, width * 2, dropout=0.0, batch_first=True, norm_first=True,
                                           activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(len(x), -1, -1), tokens], dim=1) + self.position
        return self.head(self.norm(self.encoder(tokens))[:, 0])


def image_model(kind: str, classes: int = 4) -> nn.Module:
    return {"resnet": ResNet, "mobilenet": MobileNet, "vit": ViT}[kind](classes=classes)


# -- transformers models from small configs --------------------------------------------------------------------

def language_model(kind: str, vocab: int = 64, length: int = 16) -> nn.Module:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    small = dict(vocab_size=vocab, pad_token_id=0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=length + 16, bos_token_id=1,
                                         eos_token_id=1, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, **small)
        return transformers.GPT2LMHeadModel(config)
    if kind == "llama":
        config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=length + 16, bos_token_id=1, eos_token_id=1, **small)
        return transformers.LlamaForCausalLM(config)
    if kind == "bert":
        config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, max_position_embeddings=length + 16, **small)
        return transformers.BertForMaskedLM(config)
    if kind == "t5":
        config = transformers.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                       decoder_start_token_id=0, eos_token_id=1, **small)
        return transformers.T5ForConditionalGeneration(config)
    if kind == "whisper":
        config = transformers.WhisperConfig(vocab_size=vocab, num_mel_bins=16, d_model=32, encoder_layers=1,
                                            decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                                            encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=16,
                                            max_target_positions=length + 16, pad_token_id=0, bos_token_id=1,
                                            eos_token_id=1, decoder_start_token_id=1)
        return transformers.WhisperForConditionalGeneration(config)
    raise ValueError(kind)


class LoRALinear(nn.Module):
    """A frozen base linear layer plus a trained low-rank update B @ A (B starts at zero), as LoRA does."""

    def __init__(self, base: nn.Module, rank: int = 4, alpha: float = 8.0):
        super().__init__()
        self.base = base
        for parameter in base.parameters():
            parameter.requires_grad_(False)
        weight = base.weight
        # transformers' Conv1D (GPT-2) stores the weight as (in, out); nn.Linear as (out, in).
        fan_in, fan_out = (weight.shape[0], weight.shape[1]) if type(base).__name__ == "Conv1D" else weight.shape[::-1]
        self.lora_a = nn.Parameter(torch.randn(rank, fan_in) / math.sqrt(fan_in))
        self.lora_b = nn.Parameter(torch.zeros(fan_out, rank))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale


def add_lora(model: nn.Module, targets: tuple[str, ...]) -> nn.Module:
    """Freeze every parameter and wrap the modules whose name ends with one of ``targets`` in ``LoRALinear``."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if child_name in targets:
                setattr(module, child_name, LoRALinear(child))
    return model


def mlp(inputs: int, hidden: int, classes: int) -> nn.Module:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, classes))

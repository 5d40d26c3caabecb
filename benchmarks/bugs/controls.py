"""Healthy controls of different architectures: any warning on them is a false alarm."""
from __future__ import annotations

import torch
from torch import nn

from bugs.harness import Case, Named, Run, blobs, cross_entropy, mlp, mse, regression, supervised


def mlp_regression(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 64, 64, 1))
    supervised(run, model, regression(run), mse, lr=3e-3)


def mlp_classifier(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 64, 64, 4), activation=nn.GELU)
    supervised(run, model, blobs(run), cross_entropy, optimizer=torch.optim.SGD(model.parameters(), lr=0.1,
                                                                                momentum=0.9))


def _images(run: Run, batch: int = 16) -> "callable":
    templates = torch.randn(4, 1, 12, 12, generator=run.generator)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = run.randint(4, batch)
        return templates[y] + 0.5 * run.randn(batch, 1, 12, 12), y
    return batch_of


def cnn_batchnorm(run: Run, bug: bool) -> None:
    """Convolutions with a bias before BatchNorm: the bias's gradient is zero by construction."""
    model = Named(run, ("conv0", nn.Conv2d(1, 8, 3, padding=1)), ("norm0", nn.BatchNorm2d(8)), ("relu0", nn.ReLU()),
                  (None, nn.MaxPool2d(2)), ("conv1", nn.Conv2d(8, 16, 3, padding=1)), ("norm1", nn.BatchNorm2d(16)),
                  ("relu1", nn.ReLU()), (None, nn.AdaptiveAvgPool2d(1)), (None, nn.Flatten()), (None, nn.Linear(16, 4)))
    supervised(run, model, _images(run), cross_entropy, lr=3e-3)


def conv_autoencoder(run: Run, bug: bool) -> None:
    model = Named(run, ("encoded", nn.Sequential(nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.ReLU())),
                  ("code", nn.Conv2d(8, 4, 3, padding=1)),
                  ("decoded", nn.ConvTranspose2d(4, 1, 4, stride=2, padding=1)))
    images = _images(run)
    supervised(run, model, lambda step: (lambda x, y: (x, x))(*images(step)), mse, lr=3e-3)


class _Sequence(nn.Module):
    def __init__(self, run: Run, cell: nn.Module, classes: int) -> None:
        super().__init__()
        self.run_, self.cell, self.head = run, cell, nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states, _ = self.cell(x)
        self.run_.recorder.register_tensor("states", states)
        return self.head(states[:, -1])


def _sequences(run: Run, batch: int = 16, length: int = 12) -> "callable":
    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = run.randn(batch, length, 4)
        return x, (x[:, :, 0].sum(dim=1) > 0).long()
    return batch_of


def lstm_classifier(run: Run, bug: bool) -> None:
    supervised(run, _Sequence(run, nn.LSTM(4, 32, batch_first=True), 2), _sequences(run), cross_entropy, lr=3e-3)


def gru_classifier(run: Run, bug: bool) -> None:
    supervised(run, _Sequence(run, nn.GRU(4, 32, batch_first=True), 2), _sequences(run), cross_entropy, lr=3e-3)


VOCAB, LENGTH = 16, 10


class _Transformer(nn.Module):
    def __init__(self, run: Run, *, causal: bool) -> None:
        super().__init__()
        self.run_, self.causal = run, causal
        self.embed, self.position = nn.Embedding(VOCAB, 32), nn.Parameter(0.02 * torch.randn(LENGTH, 32))
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.position
        self.run_.recorder.register_tensor("embedded", h)
        mask = nn.Transformer.generate_square_subsequent_mask(LENGTH) if self.causal else None
        h = self.blocks(h, mask=mask, is_causal=self.causal)
        self.run_.recorder.register_tensor("encoded", h)
        return self.head(h)


def _tokens(run: Run, batch: int = 16) -> tuple[torch.Tensor, "callable"]:
    successor = torch.randperm(VOCAB, generator=run.generator)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = run.randint(VOCAB, batch)
        tokens = [first]
        for _ in range(LENGTH):
            tokens.append(successor[tokens[-1]])
        sequence = torch.stack(tokens, dim=1)
        return sequence[:, :-1], sequence[:, 1:]
    return successor, batch_of


def transformer_decoder_lm(run: Run, bug: bool) -> None:
    _, batches = _tokens(run)
    supervised(run, _Transformer(run, causal=True), batches,
               lambda o, y: cross_entropy(o.reshape(-1, VOCAB), y.reshape(-1)), lr=1e-3)


def transformer_encoder_classifier(run: Run, bug: bool) -> None:
    _, batches = _tokens(run)
    model = _Transformer(run, causal=False)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, _ = batches(step)
        return tokens, (tokens[:, 0] % 2)
    supervised(run, model, batch_of, lambda o, y: cross_entropy(o.mean(dim=1)[:, :2], y), lr=1e-3)


class _Vae(nn.Module):
    def __init__(self, run: Run) -> None:
        super().__init__()
        self.run_ = run
        self.encoder, self.mu, self.log_var = nn.Sequential(nn.Linear(16, 32), nn.ReLU()), nn.Linear(32, 4), nn.Linear(32, 4)
        self.decoder = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 16))
        self.kl = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        mu, log_var = self.mu(h), self.log_var(h)
        self.run_.register(mu=mu, log_var=log_var)
        z = mu + torch.exp(0.5 * log_var) * torch.randn(mu.shape, generator=self.run_.generator)
        self.run_.register(z=z)
        self.kl = -0.5 * torch.mean(torch.sum(1 + log_var - mu ** 2 - log_var.exp(), dim=1))
        return self.decoder(z)


def vae(run: Run, bug: bool) -> None:
    model = _Vae(run)
    basis = torch.randn(4, 16, generator=run.generator)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = run.randn(32, 4) @ basis + 0.1 * run.randn(32, 16)
        return x, x
    supervised(run, model, batch_of, lambda o, y: mse(o, y) + 0.1 * model.kl, lr=3e-3)


class _Gcn(nn.Module):
    """Two graph convolutions over a fixed normalised adjacency (a small GNN)."""

    def __init__(self, run: Run, adjacency: torch.Tensor) -> None:
        super().__init__()
        self.run_, self.adjacency = run, adjacency
        self.first, self.second = nn.Linear(8, 32), nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.adjacency @ self.first(x))
        self.run_.register(node_features=h)
        return self.adjacency @ self.second(h)


def gnn(run: Run, bug: bool) -> None:
    nodes = 40
    labels = torch.randint(0, 3, (nodes,), generator=run.generator)
    same = (labels[:, None] == labels[None, :]).float()
    edges = (torch.rand(nodes, nodes, generator=run.generator) < 0.15 * same + 0.02).float()
    adjacency = ((edges + edges.T) > 0).float() + torch.eye(nodes)
    degree = adjacency.sum(dim=1)
    adjacency = adjacency / torch.sqrt(degree[:, None] * degree[None, :])
    centres = torch.randn(3, 8, generator=run.generator)
    model = _Gcn(run, adjacency)
    supervised(run, model, lambda step: (centres[labels] + 1.5 * run.randn(nodes, 8), labels), cross_entropy, lr=1e-2)


class _Attention(nn.Module):
    """Self-attention with a bias on the keys: that bias's gradient is zero by construction."""

    def __init__(self, run: Run) -> None:
        super().__init__()
        self.run_ = run
        self.query, self.key, self.value = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.query(x), self.key(x), self.value(x)
        weights = torch.softmax(q @ k.transpose(1, 2) / 4.0, dim=-1)
        self.run_.register(attention=weights)
        mixed = weights @ v
        self.run_.register(mixed=mixed)
        return self.head(mixed.mean(dim=1))


def attention_key_bias(run: Run, bug: bool) -> None:
    centres = torch.randn(4, 8, generator=run.generator)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = run.randint(4, 16)
        return centres[y][:, None, :] + run.randn(16, 6, 8), y
    supervised(run, _Attention(run), batch_of, cross_entropy, lr=3e-3)


class _Residual(nn.Module):
    def __init__(self, run: Run) -> None:
        super().__init__()
        self.run_ = run
        self.stem = nn.Linear(8, 32)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
                                     for _ in range(3)])
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for index, block in enumerate(self.blocks):
            h = h + block(h)
            self.run_.recorder.register_tensor(f"block{index}", h)
        return self.head(h)


def residual_layernorm(run: Run, bug: bool) -> None:
    supervised(run, _Residual(run), regression(run), mse, lr=1e-3)


def log_softmax_classifier(run: Run, bug: bool) -> None:
    """log_softmax outputs and NLL: the output is negative by definition."""
    model = mlp(run, (8, 32, 32, 4), last=nn.LogSoftmax(dim=1))
    supervised(run, model, blobs(run), nn.functional.nll_loss, lr=1e-2)


def _control(name: str, program, architecture: str) -> Case:
    return Case(name, program, "healthy control", healthy=True, twin=False, architecture=architecture)


CASES = [
    _control("mlp_regression", mlp_regression, "MLP"),
    _control("mlp_classifier_sgd_momentum", mlp_classifier, "MLP"),
    _control("cnn_batchnorm", cnn_batchnorm, "CNN with BatchNorm"),
    _control("conv_autoencoder", conv_autoencoder, "convolutional autoencoder"),
    _control("lstm_classifier", lstm_classifier, "LSTM"),
    _control("gru_classifier", gru_classifier, "GRU"),
    _control("transformer_decoder_lm", transformer_decoder_lm, "transformer decoder (causal LM)"),
    _control("transformer_encoder_classifier", transformer_encoder_classifier, "transformer encoder"),
    _control("vae", vae, "VAE"),
    _control("gnn", gnn, "GCN"),
    _control("attention_key_bias", attention_key_bias, "self-attention"),
    _control("residual_layernorm", residual_layernorm, "residual MLP with LayerNorm"),
    _control("log_softmax_classifier", log_softmax_classifier, "MLP with log_softmax"),
]

"""Small PyTorch models built in code (seeded random weights, nothing downloaded).

Each factory is what `bisect-tui check --torch sample_models.torch_models:NAME`
imports: it returns a module, or a module and its example inputs. The first two
are the samples for docs and tests; the others each carry one pitfall on
purpose, so the tests can prove the front end catches it.

    tiny_transformer   2 pre-norm blocks (attention, softmax, GELU MLP, dropout)
    small_cnn          conv -> batch norm -> relu twice, pool, linear (no example inputs: give --shape)
    cnn_in_training    small_cnn returned in training mode (batch-norm statistics, the article's pitfall)
    baked_scale        divides by float(x.abs().max()): the ONNX trace bakes the example input's value
    softmax_on_export  adds a softmax only while exporting (one side has softmax, the other not)
    stubborn_dropout   calls F.dropout(training=True) in forward, so eval() cannot switch it off
    drifting_buffer    updates a buffer in every forward: the weights change between runs
    unseeded           random weights from an unseeded generator: every call gives other weights
    half_mlp           parameters in float16: golden data compared in FP16 against FP32
    data_branch        an `if` on a tensor value: torch.export refuses it, the tracer bakes one branch
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _init_(module: nn.Module, seed: int) -> nn.Module:
    """Deterministic weights regardless of the global RNG: reproducible files
    and digests across runs and machines (same torch build)."""
    g = _seeded(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
            elif p.dim() == 1:  # norm scales
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
            else:
                fan_in = max(1, p[0].numel())
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
        for name, b in sorted(module.named_buffers()):
            if name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.2)
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
    return module


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.heads

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.reshape(b, t, h, d // h).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // h), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.fc2(self.act(self.fc1(self.ln2(x)))))


class TinyTransformer(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4, blocks: int = 2, classes: int = 10):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(blocks)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(x)))


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.bn2 = nn.BatchNorm2d(16)
        self.relu2 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.relu2(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


def tiny_transformer():
    model = _init_(TinyTransformer(), seed=1).eval()
    x = torch.randn(1, 8, 32, generator=_seeded(2))
    return model, (x,)


def small_cnn():
    """Module only: the input shape comes from `--shape x=1x3x16x16`."""
    return _init_(SmallCNN(), seed=3).eval()


def cnn_in_training():
    """The article's first pitfall: golden data taken with batch-norm in training mode."""
    model = _init_(SmallCNN(), seed=3).train()
    return model, (torch.randn(2, 3, 16, 16, generator=_seeded(4)),)


class BakedScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # float() turns a tensor into a Python number: a trace records the
        # example input's value as a constant (TracerWarning), so the exported
        # graph divides every later input by that one number.
        return self.fc(x) / float(x.abs().max())


def baked_scale():
    return _init_(BakedScale(), seed=5).eval(), (torch.randn(1, 16, generator=_seeded(6)),)


class SoftmaxOnExport(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if torch.onnx.is_in_onnx_export():  # "deployment" head: probabilities only in the export
            y = torch.softmax(y, dim=-1)
        return y


def softmax_on_export():
    return _init_(SoftmaxOnExport(), seed=7).eval(), (torch.randn(2, 16, generator=_seeded(8)),)


class StubbornDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.fc(x), p=0.2, training=True)


def stubborn_dropout():
    return _init_(StubbornDropout(), seed=9).eval(), (torch.randn(1, 16, generator=_seeded(10)),)


class DriftingBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.register_buffer("ema", torch.zeros(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        with torch.no_grad():
            self.ema.mul_(0.9).add_(0.1 * y.mean(0))
        return y - self.ema


def drifting_buffer():
    return _init_(DriftingBuffer(), seed=11).eval(), (torch.randn(2, 16, generator=_seeded(12)),)


def unseeded():
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).eval()  # global RNG, no seed
    return model, (torch.randn(1, 16, generator=_seeded(13)),)


def half_mlp():
    model = _init_(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)), seed=14)
    return model.half().eval(), (torch.randn(1, 16, generator=_seeded(15)),)


class DataBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if y.sum() > 0:  # Python control flow on a tensor's value
            return torch.relu(y)
        return -y


def data_branch():
    """torch.export refuses the value-dependent `if`; the tracer keeps the branch the example took."""
    return _init_(DataBranch(), seed=16).eval(), (torch.randn(1, 16, generator=_seeded(17)),)

"""Built-in models: linear, mlp, a small CNN, a DCGAN pair (torchvision's classifiers: tvmodels).

`in_channels`, `num_classes` (and `input_shape`) are filled from the dataset when a config
leaves them out; a factory may return one module or a dict of named modules (the GAN pair).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from expctl.builtin import checks
from expctl.registry import register


@register("models", inferred=("input_shape", "num_classes"), check=checks.model)
def linear(input_shape: Sequence[int] = (), num_classes: int = 1) -> nn.Module:
    """One linear layer on the flattened input (linear / logistic regression)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


@register("models", inferred=("input_shape", "num_classes"), check=checks.model)
def mlp(
    input_shape: Sequence[int] = (),
    num_classes: int = 1,
    hidden: Sequence[int] = (256, 128),
    dropout: float = 0.0,
) -> nn.Module:
    """Multi-layer perceptron with ReLU on the flattened input."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


@register("models", inferred=("in_channels", "num_classes"), check=checks.model)
def cnn(
    in_channels: int = 1, num_classes: int = 10, width: int = 32, dropout: float = 0.0
) -> nn.Module:
    """Small CNN: two conv-BN-ReLU-pool blocks, global pooling to 4x4, two linear layers."""

    def block(cin: int, cout: int) -> list[nn.Module]:
        return [
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
            nn.MaxPool2d(2),
        ]

    return nn.Sequential(
        *block(in_channels, width),
        *block(width, 2 * width),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(2 * width * 16, 128),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(128, num_classes),
    )


class _Residual(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


@register("models", inferred=("in_channels", "num_classes"), check=checks.model)
def speednet(in_channels: int = 1, num_classes: int = 10, width: int = 32) -> nn.Module:
    """ResNet-9-style net for small images (conv, 3 pooled stages, 2 residual blocks)."""

    def conv(cin: int, cout: int, pool: bool = False) -> list[nn.Module]:
        layers = [
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
        ]
        return layers + ([nn.MaxPool2d(2, ceil_mode=True)] if pool else [])

    w = width
    return nn.Sequential(
        *conv(in_channels, w),
        *conv(w, 2 * w, pool=True),
        _Residual(nn.Sequential(*conv(2 * w, 2 * w), *conv(2 * w, 2 * w))),
        *conv(2 * w, 4 * w, pool=True),
        *conv(4 * w, 8 * w, pool=True),
        _Residual(nn.Sequential(*conv(8 * w, 8 * w), *conv(8 * w, 8 * w))),
        nn.AdaptiveMaxPool2d(1),
        nn.Flatten(),
        nn.Linear(8 * w, num_classes, bias=False),
        _Scale(0.125),  # small logits at the start: max-pooled features are large
    )


class _Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class _Generator(nn.Module):
    def __init__(self, latent_dim: int, features: int, channels: int, size: int) -> None:
        super().__init__()
        self.latent_dim, self.start = latent_dim, size // 4
        self.net = nn.Sequential(
            nn.ConvTranspose2d(latent_dim, features * 2, self.start, 1, 0, bias=False),
            nn.BatchNorm2d(features * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(features * 2, features, 4, 2, 1, bias=False),
            nn.BatchNorm2d(features),
            nn.ReLU(True),
            nn.ConvTranspose2d(features, channels, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z.view(z.shape[0], self.latent_dim, 1, 1))


def _discriminator(features: int, channels: int, size: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(channels, features, 4, 2, 1, bias=False),
        nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(features, features * 2, 4, 2, 1, bias=False),
        nn.BatchNorm2d(features * 2),
        nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(features * 2, 1, size // 4, 1, 0, bias=False),
        nn.Flatten(),
    )


def _dcgan_init(m: nn.Module) -> None:
    if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif isinstance(m, nn.BatchNorm2d):
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


@register("models", inferred=("input_shape",), check=checks.model)
def dcgan(
    input_shape: Sequence[int] = (1, 28, 28), latent_dim: int = 100, features: int = 32
) -> dict[str, nn.Module]:
    """DCGAN generator + discriminator (seed 000's DCGAN; use with train.step=gan)."""
    channels, size = int(input_shape[0]), int(input_shape[-1])
    if size % 4:
        raise ValueError(f"dcgan needs an image side divisible by 4, got {size}")
    gen, disc = (
        _Generator(latent_dim, features, channels, size),
        _discriminator(features, channels, size),
    )
    gen.apply(_dcgan_init)
    disc.apply(_dcgan_init)
    return {"generator": gen, "discriminator": disc}

"""Models the benchmarks need beyond expctl's own, registered as a user would (`imports:`).

`resnet18_cifar`: torchvision's ResNet-18 with the CIFAR stem (a 3x3 stride-1 first convolution,
no max-pool), the usual network for 32x32 images: 16x the arithmetic of the ImageNet stem on the
same images, so a CIFAR-sized run is no longer bound by kernel launches.
"""

from __future__ import annotations

from torch import nn

from expctl import register


@register("models", inferred=("in_channels", "num_classes"))
def resnet18_cifar(in_channels: int = 3, num_classes: int = 10) -> nn.Module:
    from torchvision.models import resnet18

    model = resnet18(num_classes=num_classes)
    model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()  # type: ignore[assignment]
    return model

"""The black-box predictors of the paper's Section 6: Lipton et al.'s MNIST network and the CIFAR ResNet-18.

Both take images scaled to [0, 1] as float tensors of shape (N, C, H, W) and return logits (N, n_classes). The
per-channel standardisation (x - mean) / std is the model's first layer (:class:`Standardize`, fixed buffers), so a
saved model carries its own preprocessing and :func:`labelshift.experiments.training.predict_logits` only divides uint8
pixels by 255.

* ``"lenet"`` -- the MNIST network of Lipton, Wang and Smola, "Detecting and Correcting for Label Shift with Black
  Box Predictors" (ICML 2018), which Section 6 reuses: conv 20 @ 5x5 (ReLU), max-pool 2, conv 50 @ 5x5 (ReLU),
  max-pool 2, dense 256 (ReLU), dense n_classes. On 28x28 inputs the convolutions are unpadded (28 -> 24 -> 12 ->
  8 -> 4, so 50 * 4 * 4 features), as in the original. Inputs too small for that (8x8 ``digits``: two unpadded 5x5
  convolutions and two poolings would leave nothing) get 'same' padding of 2 on both convolutions instead
  (8 -> 8 -> 4 -> 4 -> 2, so 50 * 2 * 2 features); :func:`lenet_padding` states the rule.
* ``"resnet18"`` -- ResNet-18 of He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016), in the
  CIFAR form used by Azizzadenesheli et al. (ICLR 2019) and the paper (after kuangliu/pytorch-cifar): a 3x3
  stride-1 stem convolution with 64 channels and no max-pool, four stages of two BasicBlocks with 64, 128, 256
  and 512 channels (stride 2 at the start of stages 2-4, a 1x1 convolution on the shortcut when the shape
  changes), global average pooling and one linear layer.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..errors import InputError

MODELS = ("lenet", "resnet18")


class Standardize(nn.Module):
    """(x - mean) / std per channel, with mean and std as fixed (non-trained) buffers saved in the state dict."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(list(mean), dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(list(std), dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def lenet_padding(image_size: int) -> int:
    """Padding of LeNet's two 5x5 convolutions: 0 (the original) when the image is big enough that the last
    feature map is at least 2x2 without padding (image_size >= 24), otherwise 2 ('same' padding)."""
    unpadded = ((image_size - 4) // 2 - 4) // 2
    return 0 if unpadded >= 2 else 2


class LeNet(nn.Module):
    """Lipton et al. (2018)'s MNIST network; see the module docstring for the layers and the padding rule."""

    def __init__(self, n_classes: int = 10, in_channels: int = 1, image_size: int = 28,
                 mean: Sequence[float] = (0.5,), std: Sequence[float] = (0.5,), hidden: int = 256):
        super().__init__()
        pad = lenet_padding(image_size)
        side = ((image_size + 2 * pad - 4) // 2 + 2 * pad - 4) // 2
        if side < 1:
            raise InputError(f"image_size {image_size} is too small for the LeNet layers; use at least 4 pixels.")
        self.standardize = Standardize(mean, std)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 20, kernel_size=5, padding=pad), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(20, 50, kernel_size=5, padding=pad), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(50 * side * side, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, n_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(self.standardize(x)))


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 conv-BN) shortcut, ReLU after the sum (He et al. 2016)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(planes))
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 in its CIFAR form (3x3 stem, no max-pool, BasicBlocks [2, 2, 2, 2], widths 64-512)."""

    def __init__(self, n_classes: int = 10, in_channels: int = 3, image_size: int = 32,
                 mean: Sequence[float] = (0.5, 0.5, 0.5), std: Sequence[float] = (0.5, 0.5, 0.5),
                 widths: Sequence[int] = (64, 128, 256, 512), blocks: Sequence[int] = (2, 2, 2, 2)):
        super().__init__()
        self.standardize = Standardize(mean, std)
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, stride=1, padding=1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True))
        stages, in_planes = [], widths[0]
        for i, (planes, n_blocks) in enumerate(zip(widths, blocks)):
            layers = []
            for b in range(n_blocks):
                layers.append(BasicBlock(in_planes, planes, stride=2 if (i > 0 and b == 0) else 1))
                in_planes = planes
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)  # works for any input size, 32x32 gives a 4x4 map here
        self.fc = nn.Linear(in_planes, n_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.stages(self.stem(self.standardize(x)))
        return self.fc(torch.flatten(self.pool(out), 1))


def build_model(name: str, n_classes: int, in_channels: int, image_size: int, *,
                mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                seed: int | None = None) -> nn.Module:
    """Build ``"lenet"`` or ``"resnet18"`` for ``in_channels`` x ``image_size`` x ``image_size`` inputs.

    Args:
        mean, std: per-channel standardisation of [0, 1] pixels (one value, or one per channel); 0.5 / 0.5 when
            None. Take them from :class:`labelshift.experiments.datasets.Dataset` (``ds.mean``, ``ds.std``).
        seed: when given, the initial weights are drawn from ``torch.manual_seed(seed)`` without disturbing the
            caller's global random state, so the same seed gives the same initial model.

    The returned module has a JSON-able ``config`` attribute (these arguments) from which
    :func:`labelshift.experiments.training.load_checkpoint` rebuilds it.
    """
    if name not in MODELS:
        raise InputError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}.")
    if int(n_classes) < 2:
        raise InputError(f"n_classes must be at least 2, got {n_classes}.")
    if int(in_channels) < 1 or int(image_size) < 1:
        raise InputError(f"in_channels and image_size must be positive, got {in_channels} and {image_size}.")
    mean = [0.5] * in_channels if mean is None else [float(v) for v in mean]
    std = [0.5] * in_channels if std is None else [float(v) for v in std]
    if len(mean) == 1:
        mean = mean * in_channels
    if len(std) == 1:
        std = std * in_channels
    if len(mean) != in_channels or len(std) != in_channels or min(std) <= 0:
        raise InputError(f"mean and std need 1 or {in_channels} values (std > 0), got {mean} and {std}.")
    cls = LeNet if name == "lenet" else ResNet18
    kwargs = dict(n_classes=int(n_classes), in_channels=int(in_channels), image_size=int(image_size),
                  mean=mean, std=std)
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(int(seed))
        model = cls(**kwargs)
    model.config = {"name": name, **kwargs}
    return model


def build_model_for(dataset, name: str | None = None, seed: int | None = None) -> nn.Module:
    """The default architecture for a loaded :class:`~labelshift.experiments.datasets.Dataset` (its registry entry's
    model, ``lenet`` for unknown ones), with the dataset's shape and normalisation."""
    from .datasets import DATASETS

    spec = DATASETS.get(dataset.name)
    name = name or (spec.model if spec else "lenet")
    return build_model(name, dataset.n_classes, dataset.in_channels, dataset.image_size,
                       mean=dataset.mean, std=dataset.std, seed=seed)

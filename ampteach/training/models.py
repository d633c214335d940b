"""The course's FashionMNIST models: small enough for a laptop CPU, wide enough for a GPU.

    model = mlp(hidden=(256,))                   # lessons and tests: trains in seconds on a CPU
    model = mlp(hidden=(4096, 4096, 4096))       # `ampteach bench` on a GPU: compute-bound matmuls
    model = cnn(channels=(32, 64))               # convolutions + BatchNorm (lessons 3 and 5)

Widths are multiples of 8 so half-precision matmuls can use tensor cores.
"""

from __future__ import annotations

from torch import nn

IN_FEATURES = 28 * 28
N_CLASSES = 10


def mlp(hidden: tuple[int, ...] = (256,), activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """Flatten -> [Linear -> activation] per hidden width -> Linear(10)."""
    if not hidden or any(h < 1 for h in hidden):
        raise ValueError(f"hidden must be a non-empty tuple of positive widths, got {hidden!r}")
    layers: list[nn.Module] = [nn.Flatten()]
    width = IN_FEATURES
    for h in hidden:
        layers += [nn.Linear(width, h), activation()]
        width = h
    layers.append(nn.Linear(width, N_CLASSES))
    return nn.Sequential(*layers)


def cnn(channels: tuple[int, ...] = (32, 64), hidden: int = 128, batchnorm: bool = True) -> nn.Sequential:
    """[Conv3x3 -> (BatchNorm) -> ReLU -> MaxPool2] per channel count -> Linear(hidden) -> ReLU -> Linear(10)."""
    if not channels or len(channels) > 4:
        raise ValueError(f"channels must hold 1 to 4 channel counts (28 px halves at each), got {channels!r}")
    layers: list[nn.Module] = []
    c_in, side = 1, 28
    for c in channels:
        layers.append(nn.Conv2d(c_in, c, kernel_size=3, padding=1, bias=not batchnorm))
        if batchnorm:
            layers.append(nn.BatchNorm2d(c))
        layers += [nn.ReLU(), nn.MaxPool2d(2)]
        c_in, side = c, side // 2
    layers += [nn.Flatten(), nn.Linear(c_in * side * side, hidden), nn.ReLU(), nn.Linear(hidden, N_CLASSES)]
    return nn.Sequential(*layers)

"""Plain ``nn.Module`` networks. Each takes ``input_shape`` and ``num_outputs`` (linked from the DataModule by
the CLI, so nobody types them twice) and returns one output per target (class logits, or values). Add your own
here and select it in the config with ``model.init_args.net.class_path``."""

import math

import torch
from torch import Tensor, nn

from project.engine import ConfigError


def _check_dropout(dropout: float) -> None:
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"model.net.init_args.dropout={dropout!r}: dropout must lie in [0, 1).")


class MLP(nn.Module):
    """Flatten -> Linear -> ReLU -> Linear -> LayerNorm -> ReLU -> Dropout -> Linear."""

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, hidden: int = 256, dropout: float = 0.1) -> None:
        super().__init__()
        if hidden < 1:
            raise ConfigError(f"model.net.init_args.hidden={hidden!r}: the hidden width must be >= 1.")
        _check_dropout(dropout)
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(math.prod(input_shape), hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.LayerNorm(hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_outputs),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class ConvNet(nn.Module):
    """Two 3x3 conv blocks and a 2x2 max-pool, then a linear layer; sized for small images like 8x8."""

    def __init__(
        self, input_shape: tuple[int, ...], num_outputs: int, channels: int = 32, dropout: float = 0.1
    ) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError(f"ConvNet needs images shaped (channels, height, width), got input_shape={input_shape}.")
        if channels < 1:
            raise ConfigError(f"model.net.init_args.channels={channels!r}: the channel count must be >= 1.")
        _check_dropout(dropout)
        in_channels, height, width = input_shape
        self.layers = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(2 * channels * (height // 2) * (width // 2), num_outputs),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class _ResidualBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus the input (1x1 conv when the shape changes), then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
        )
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.skip = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.body(x) + self.skip(x))


class ResNet(nn.Module):
    """A small residual CNN for real images, any size from 8x8 to 224x224: a stem (a 3x3 conv, plus a stride-2
    conv and max-pool when the image is larger than 64 pixels), ``stages`` stages of ``blocks`` residual blocks
    (each stage after the first halves the resolution and doubles the width): the ``backbone``; then the ``head``:
    global average pooling, dropout and a linear layer.

    BatchNorm normalises over each process's batch: with DDP, ``trainer.sync_batchnorm: true`` makes it use the
    global batch, so that 2 processes x B equal 1 process x 2B (docs/scaling.md, "Several devices")."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_outputs: int,
        width: int = 32,
        stages: int = 3,
        blocks: int = 1,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError(f"ResNet needs images shaped (channels, height, width), got input_shape={input_shape}.")
        for key, value in (("width", width), ("stages", stages), ("blocks", blocks)):
            if value < 1:
                raise ConfigError(f"model.net.init_args.{key}={value!r}: must be >= 1.")
        _check_dropout(dropout)
        in_channels, height, width_px = input_shape
        large = min(height, width_px) > 64
        stem: list[nn.Module] = [
            nn.Conv2d(in_channels, width, 3, stride=2 if large else 1, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        ]
        if large:
            stem.append(nn.MaxPool2d(3, stride=2, padding=1))
        layers, channels = [*stem], width
        for stage in range(stages):
            out = width * 2**stage
            for block in range(blocks):
                layers.append(_ResidualBlock(channels, out, stride=2 if stage > 0 and block == 0 else 1))
                channels = out
        self.backbone = nn.Sequential(*layers)  # what model.freeze_backbone and model.backbone_lr_scale act on
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(channels, num_outputs)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.backbone(x))


def _conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    """Two 3x3 conv-GroupNorm-ReLU layers. GroupNorm normalises each sample over itself, never over the batch, so
    accumulation and DDP give the big batch's gradient exactly (docs/scaling.md, Several devices)."""
    layers: list[nn.Module] = []
    for channels in (in_channels, out_channels):
        layers += [
            nn.Conv2d(channels, out_channels, 3, padding=1, bias=False),
            nn.GroupNorm(math.gcd(out_channels, 8), out_channels),
            nn.ReLU(),
        ]
    return nn.Sequential(*layers)


class UNet(nn.Module):
    """A small U-Net for segmentation: ``depth`` times (a conv block, then a 2x2 max-pool halving the resolution and
    doubling the width from ``channels``), a conv block at the bottom, then as many times (a 2x2 transposed conv
    doubling the resolution, the encoder's features of that resolution concatenated, a conv block), and a 1x1 conv
    giving ``num_outputs`` logits per pixel: outputs shaped (batch, num_outputs, H, W) for inputs (batch, C, H, W).

    Any H and W divisible by 2**depth. It upsamples with transposed convolutions, not bilinear interpolation, whose
    backward has no deterministic CUDA kernel (``trainer.deterministic: true``)."""

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, channels: int = 16, depth: int = 2) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError(f"UNet needs images shaped (channels, height, width), got input_shape={input_shape}.")
        for key, value in (("channels", channels), ("depth", depth)):
            if value < 1:
                raise ConfigError(f"model.net.init_args.{key}={value!r}: must be >= 1.")
        in_channels, height, width = input_shape
        if height % 2**depth or width % 2**depth:
            raise ConfigError(
                f"UNet with model.net.init_args.depth={depth} halves the image {depth} times: its height and width "
                f"must be divisible by {2**depth}, got {height}x{width} (change data.image_size or the depth)."
            )
        widths = [channels * 2**level for level in range(depth + 1)]
        inputs = [in_channels, *widths[:-2]]
        self.down = nn.ModuleList(_conv_block(a, b) for a, b in zip(inputs, widths[:-1], strict=True))
        self.pool = nn.MaxPool2d(2)
        self.bottom = _conv_block(widths[-2], widths[-1])
        self.up = nn.ModuleList(nn.ConvTranspose2d(w, w // 2, 2, stride=2) for w in reversed(widths[1:]))
        self.merge = nn.ModuleList(_conv_block(w, w // 2) for w in reversed(widths[1:]))
        self.head = nn.Conv2d(channels, num_outputs, 1)

    def forward(self, x: Tensor) -> Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottom(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips), strict=True):
            x = merge(torch.cat([up(x), skip], dim=1))
        return self.head(x)

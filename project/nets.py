"""Plain ``nn.Module`` networks. Each takes ``input_shape`` and ``num_classes`` (linked from the DataModule by
the CLI, so nobody types them twice) and returns logits. Add your own here and select it in the config with
``model.net.class_path``."""

import math

from torch import Tensor, nn

from project.errors import ConfigError


def _check_dropout(dropout: float) -> None:
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"model.net.init_args.dropout={dropout!r}: dropout must lie in [0, 1).")


class MLP(nn.Module):
    """Flatten -> Linear -> ReLU -> Linear -> LayerNorm -> ReLU -> Dropout -> Linear."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: int = 256, dropout: float = 0.1) -> None:
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
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class ConvNet(nn.Module):
    """Two 3x3 conv blocks and a 2x2 max-pool, then a linear classifier; sized for small images like 8x8."""

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, channels: int = 32, dropout: float = 0.1
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
            nn.Linear(2 * channels * (height // 2) * (width // 2), num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)

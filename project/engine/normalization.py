"""The input statistics a DataModule standardises float inputs with (``data.normalize``): the training split's mean
and standard deviation per channel (per feature for a table), or those the net declares it expects (a pretrained
backbone's). Plain lists of floats, so a checkpoint that keeps them still loads with ``weights_only=True``."""

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from project.engine.errors import ConfigError
from project.engine.loaders import worker_count

# At most this many training samples (a seeded random subset) are read to compute the statistics.
NORMALIZATION_SAMPLES = 10_000


def declared_statistics(stats: dict[str, list[float]], channels: int) -> dict[str, list[float]]:
    """The net's expected statistics, per channel of these inputs: RGB statistics for one grayscale channel are
    averaged (as timm sums an RGB stem's kernels into a one-channel one)."""
    mean, std = list(stats["mean"]), list(stats["std"])
    if len(mean) != channels and channels == 1:
        mean, std = [sum(mean) / len(mean)], [sum(std) / len(std)]
    if len(mean) != channels or len(std) != channels:
        raise ConfigError(
            f"The net expects inputs normalised with {len(mean)} channel statistics but the data has {channels} "
            "channels: set data.normalize=train (the training split's statistics) or false."
        )
    return {"mean": mean, "std": std}


def training_statistics(train_set: Dataset, channels: int, seed: int, workers: int) -> dict[str, list[float]]:
    """The mean and standard deviation per channel (dimension 0 of a sample) of up to ``NORMALIZATION_SAMPLES``
    training samples, drawn with ``seed``, in float64."""
    n = len(train_set)  # type: ignore[arg-type]
    picked = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    subset = Subset(train_set, sorted(picked[:NORMALIZATION_SAMPLES].tolist()))
    total = torch.zeros(channels, dtype=torch.float64)
    total_sq, count = torch.zeros(channels, dtype=torch.float64), 0
    # A generator of its own: an iterator over a loader without one draws its worker seed from the global RNG, which
    # would shift every later dropout mask of the run depending on whether inputs are normalised.
    loader = DataLoader(subset, batch_size=256, num_workers=workers, generator=torch.Generator())
    for x, _ in loader:
        x = x.double().transpose(0, 1).flatten(1)  # (channel or feature, everything else)
        total, total_sq, count = total + x.sum(1), total_sq + (x * x).sum(1), count + x.shape[1]
    mean = total / count
    std = (total_sq / count - mean * mean).clamp_min(0).sqrt().clamp_min(1e-6)  # a constant input stays finite
    return {"mean": mean.tolist(), "std": std.tolist()}


def statistics_for(datamodule: Any) -> dict[str, list[float]]:
    """The statistics ``data.normalize`` asks for: those the net expects (``expected_normalization``, handed over by
    the CLI) unless it is ``train``, else the training split's."""
    settings, channels = datamodule.hparams, datamodule.input_shape[0]
    expected = datamodule.expected_normalization if settings["normalize"] is True else None
    if expected:
        return declared_statistics(expected, channels)
    if datamodule.train_set is None:
        datamodule.setup("fit")
    workers = worker_count(settings["num_workers"], datamodule.trainer)
    return training_statistics(datamodule.train_set, channels, settings["split_seed"], workers)


def as_tensors(stats: dict[str, list[float]], ndim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) in float64 on ``device``, shaped to broadcast over a batch of samples of ``ndim`` dimensions."""
    view = (-1,) + (1,) * (ndim - 1)
    mean, std = (torch.tensor(stats[k], dtype=torch.float64, device=device).view(view) for k in ("mean", "std"))
    return mean, std


def standardized(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """``x`` standardised in its own dtype (the statistics are float64)."""
    return (x - mean.to(x.dtype)) / std.to(x.dtype)

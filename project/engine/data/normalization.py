"""The input statistics a DataModule standardises float inputs with (``data.normalize``): the training split's mean
and standard deviation per channel (per feature for a table), or those the net declares it expects (a pretrained
backbone's). Plain lists of floats, so a checkpoint that keeps them still loads with ``weights_only=True``."""

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from project.engine.data.loaders import worker_count
from project.engine.errors import ConfigError

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


def training_statistics(
    train_set: Dataset, channels: dict[Any, int], seed: int, workers: int, inputs_of: Callable[[Any], Any]
) -> dict[Any, dict[str, list[float]]]:
    """The mean and standard deviation per channel (dimension 0 of a sample) of up to ``NORMALIZATION_SAMPLES``
    training samples, drawn with ``seed``, in float64: for each input ``channels`` names (None: the one input tensor
    ``inputs_of`` a batch returns; else its named inputs)."""
    n = len(train_set)  # type: ignore[arg-type]
    picked = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    subset = Subset(train_set, sorted(picked[:NORMALIZATION_SAMPLES].tolist()))
    total = {name: torch.zeros(c, dtype=torch.float64) for name, c in channels.items()}
    total_sq = {name: torch.zeros(c, dtype=torch.float64) for name, c in channels.items()}
    count = dict.fromkeys(channels, 0)
    # A generator of its own: an iterator over a loader without one draws its worker seed from the global RNG, which
    # would shift every later dropout mask of the run depending on whether inputs are normalised.
    loader = DataLoader(subset, batch_size=256, num_workers=workers, generator=torch.Generator())
    for batch in loader:
        inputs = inputs_of(batch)
        for name in channels:
            x = (inputs if name is None else inputs[name]).double().transpose(0, 1).flatten(1)  # (channel, the rest)
            total[name], total_sq[name] = total[name] + x.sum(1), total_sq[name] + (x * x).sum(1)
            count[name] += x.shape[1]
    stats = {}
    for name in channels:
        mean = total[name] / count[name]
        std = (total_sq[name] / count[name] - mean * mean).clamp_min(0).sqrt().clamp_min(1e-6)  # constant: finite
        stats[name] = {"mean": mean.tolist(), "std": std.tolist()}
    return stats


def statistics_for(datamodule: Any) -> dict[str, Any]:
    """The statistics ``data.normalize`` asks for: those the net expects (``expected_normalization``, handed over by
    the CLI) unless it is ``train``, else the training split's."""
    settings, named = datamodule.hparams, datamodule.named_inputs
    if named:  # each float input has statistics of its own (token ids, masks: none)
        channels = {n: shape[0] for n, (shape, dtype) in named.items() if dtype.is_floating_point}
    else:
        channels = {None: datamodule.input_shape[0]}
    expected = datamodule.expected_normalization if settings["normalize"] is True else None
    if expected and named:
        raise ConfigError(
            f"The net expects inputs normalised with its own statistics, but the data has several named inputs "
            f"({', '.join(named)}): set data.normalize=train (each input's training statistics) or false."
        )
    if expected:
        return declared_statistics(expected, channels[None])
    if datamodule.train_set is None:
        datamodule.setup("fit")
    workers = worker_count(settings["num_workers"], datamodule.trainer)
    stats = training_statistics(datamodule.train_set, channels, settings["split_seed"], workers, datamodule.inputs_of)
    return stats if named else stats[None]


def normalize(inputs: Any, stats: Any, cache: dict[str | None, tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """Raw inputs (one tensor, several named ones, or a tuple of such) standardised with ``stats`` (one input's, or
    name: that), in their own dtype; a named input without statistics (token ids, a mask) passes unchanged.
    ``cache`` keeps the statistics as tensors on the inputs' device, built once per device."""
    if isinstance(inputs, list | tuple):
        return type(inputs)(normalize(x, stats, cache) for x in inputs)
    if isinstance(inputs, dict):
        return {name: _standardized(x, stats.get(name), name, cache) for name, x in inputs.items()}
    return _standardized(inputs, stats, None, cache)


def _standardized(x: torch.Tensor, stats: dict[str, list[float]] | None, name: str | None, cache: dict) -> torch.Tensor:
    if stats is None:
        return x
    if name not in cache or cache[name][0].device != x.device:
        view = (-1,) + (1,) * (x.ndim - 2)  # broadcast over a batch of samples, per channel (dimension 1)
        mean, std = (torch.tensor(stats[k], dtype=torch.float64, device=x.device).view(view) for k in ("mean", "std"))
        cache[name] = mean, std
    mean, std = cache[name]
    return (x - mean.to(x.dtype)) / std.to(x.dtype)  # the statistics are float64

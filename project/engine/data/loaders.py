"""Every DataLoader setting of a DataModule in one place: batch size per process, workers (their seeds drawn from the
run's seed, never from the global RNG), pinned memory, prefetching."""

import os
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, SequentialSampler, Subset

from project.engine.data.samplers import ResumableDataLoader, ResumableSampler, UnpaddedDistributedSampler
from project.engine.errors import ConfigError


def check_loader_settings(
    batch_size: int,
    num_workers: int | None,
    prefetch_factor: int,
    val_fraction: float,
    test_fraction: float,
    eval_samples: int | None,
) -> None:
    if batch_size < 1:
        raise ConfigError(f"data.batch_size={batch_size!r}: the batch size must be >= 1.")
    if num_workers is not None and num_workers < 0:
        raise ConfigError(f"data.num_workers={num_workers!r}: the worker count must be >= 0.")
    if prefetch_factor < 1:
        raise ConfigError(f"data.prefetch_factor={prefetch_factor!r}: must be >= 1.")
    if eval_samples is not None and eval_samples < 1:
        raise ConfigError(f"data.eval_samples={eval_samples!r}: evaluate at least 1 sample, or null for every one.")
    for key, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 < value < 1.0:
            raise ConfigError(f"data.{key}={value!r}: a fraction must lie strictly between 0 and 1.")
    if val_fraction + test_fraction >= 1.0:
        raise ConfigError(
            f"data.val_fraction + data.test_fraction = {val_fraction + test_fraction!r}: "
            "together they must be < 1 to leave samples for training."
        )


def run_seed() -> int:
    """The run's seed (``seed_everything``, which Lightning exports as PL_GLOBAL_SEED), as Lightning's own samplers
    read it."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


def world_of(trainer: Any) -> tuple[int, int]:
    """(processes, this one's rank): (1, 0) outside a Trainer."""
    return (trainer.world_size, trainer.global_rank) if trainer else (1, 0)


def worker_count(num_workers: int | None, trainer: Any) -> int:
    """``data.num_workers``, or for None one per CPU core available to this process, shared among the processes on
    this machine, at most 8."""
    if num_workers is None:
        per_machine = trainer.num_devices if trainer else 1
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        num_workers = min(8, max(1, cores // per_machine))
    return num_workers


def build_loader(
    datamodule: Any, dataset: Dataset, sampler: Sampler, loader_class: type[DataLoader] = DataLoader, **kwargs: Any
) -> DataLoader:
    """A loader over ``dataset`` in ``sampler``'s order, with the DataModule's settings (its ``hparams``)."""
    settings, trainer = datamodule.hparams, datamodule.trainer
    workers = worker_count(settings["num_workers"], trainer)
    pin = settings["pin_memory"]
    if pin is None:
        pin = trainer is not None and trainer.strategy.root_device.type == "cuda"
    return loader_class(
        dataset,
        batch_size=settings["batch_size"],
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin,
        persistent_workers=settings["persistent_workers"] and workers > 0,
        prefetch_factor=settings["prefetch_factor"] if workers > 0 else None,
        # Worker seeds are drawn from this generator, not from the global RNG, which stays untouched by loaders (its
        # state is checkpointed for dropout; see project/engine/checkpointing/rng.py).
        generator=torch.Generator().manual_seed(run_seed()),
        collate_fn=datamodule.collate_fn,
        **kwargs,
    )


def train_loader(datamodule: Any, state: dict[str, int] | None) -> ResumableDataLoader:
    """The training split's loader: this process's share, in the run seed's and the epoch's order, from ``state``'s
    position (a resumed run's) when given."""
    world_size, rank = world_of(datamodule.trainer)
    sampler: Sampler
    if _overfitting(datamodule.trainer):
        sampler = SequentialSampler(datamodule.train_set)
    else:  # drop_last: with several processes the uneven tail is dropped (another each epoch), never padded
        sampler = ResumableSampler(
            datamodule.train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=run_seed(), drop_last=True
        )
    drop_last = datamodule.hparams["drop_last"]
    loader = build_loader(datamodule, datamodule.train_set, sampler, ResumableDataLoader, drop_last=drop_last)
    assert isinstance(loader, ResumableDataLoader)
    if state is not None:
        loader.load_state_dict(state)
    return loader


def evaluated(dataset: Dataset, limit: int | None) -> Dataset:
    """What an evaluation reads of a split: all of it, or ``limit`` samples evenly spaced over it, the same ones every
    time (whatever the batch size, the process count or the run), so that curves stay comparable, a resumed run
    evaluates what the uninterrupted one did, and a corpus ten times larger costs no more per validation."""
    count = len(dataset)  # type: ignore[arg-type]
    if limit is None or limit >= count:
        return dataset
    return Subset(dataset, [i * count // limit for i in range(limit)])


def eval_loader(datamodule: Any, dataset: Dataset | None, limit: int | None = None) -> DataLoader:
    """Every sample of ``dataset`` (or of the ``limit`` ``evaluated`` reads) exactly once, shared out over the
    processes unpadded."""
    assert dataset is not None, "call setup() first"
    dataset = evaluated(dataset, limit)
    world_size, rank = world_of(datamodule.trainer)
    if len(dataset) < world_size:  # type: ignore[arg-type]
        raise ConfigError(f"An evaluation split of {len(dataset)} samples cannot feed {world_size} processes.")  # type: ignore[arg-type]
    if _overfitting(datamodule.trainer):
        return build_loader(datamodule, dataset, SequentialSampler(dataset))  # type: ignore[arg-type]
    return build_loader(datamodule, dataset, UnpaddedDistributedSampler(dataset, world_size, rank))


def _overfitting(trainer: Any) -> bool:
    """``trainer.overfit_batches`` in a fit: Lightning reads every loader of it in order (the same batches each
    epoch), and swaps in its own SequentialSampler, with a warning, where a loader has another sampler."""
    return bool(trainer and trainer.overfit_batches and trainer.state.fn == "fit")

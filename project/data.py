"""The data: a Dataset of scikit-learn's bundled handwritten digits, and the DataModule that splits it and owns
every DataLoader setting, the samplers included. Replace ``DigitsDataset``/``load_digits_tensors`` with your
own data; keep the DataModule's contract (``num_classes``, ``input_shape``, the three loaders)."""

import math
import os
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from sklearn.datasets import load_digits
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from project.errors import ConfigError
from project.predict import load_inputs
from project.resumable import ResumableDataLoader, ResumableSampler


def load_digits_tensors() -> tuple[Tensor, Tensor]:
    """All 1,797 digits as float32 images shaped (N, 1, 8, 8) scaled to [0, 1], and int64 labels.
    The data ships inside scikit-learn: nothing is downloaded."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return images, torch.tensor(digits.target, dtype=torch.int64)


class DigitsDataset(Dataset[tuple[Tensor, Tensor]]):
    """(image, label) pairs held in memory."""

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.images[index], self.labels[index]


class UnpaddedDistributedSampler(DistributedSampler):
    """Evaluation sampler giving rank r the samples r, r+W, r+2W, ...: every sample is seen exactly once.

    torch's DistributedSampler pads the index list with repeats so every rank gets the same count, and
    torchmetrics does not remove them, so DDP val/test metrics would be biased (LIGHTNING_NOTES §1, §6). Uneven
    shards are safe here because evaluation makes no per-step collective call (metrics sync once, at epoch end).
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        self.num_samples = len(range(rank, len(self.dataset), num_replicas))  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, len(self.dataset), self.num_replicas))  # type: ignore[arg-type]


def _run_seed() -> int:
    """The run's seed (``seed_everything``, which Lightning exports as PL_GLOBAL_SEED), as Lightning's own samplers
    read it."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


class DigitsDataModule(L.LightningDataModule):
    """Scikit-learn's digits, split train/val/test by a fixed seed, served to one or many processes.

    ``batch_size`` is per process: the global batch is batch_size x devices x num_nodes x accumulate_grad_batches.
    The train sampler is a seeded ``DistributedSampler`` on every run, one process included, so the sample order
    depends only on the run's seed and the epoch (Lightning calls ``set_epoch``), never on global RNG state; the
    train loader is resumable mid-epoch (``project/resumable.py``).
    """

    num_classes = 10
    input_shape = (1, 8, 8)

    def __init__(
        self,
        batch_size: int = 64,
        num_workers: int | None = 0,
        pin_memory: bool | None = None,
        persistent_workers: bool = True,
        prefetch_factor: int = 2,
        drop_last: bool = False,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 1234,
        predict_path: str | None = None,
    ) -> None:
        """
        Args:
            batch_size: samples per batch per process.
            num_workers: DataLoader worker processes (0 = load in the training process, right for in-memory data;
                None = one per CPU core available to this process, shared among the processes on this machine,
                at most 8).
            pin_memory: page-locked host memory for faster host-to-GPU copies; ``None`` = on when training on CUDA.
            persistent_workers: keep workers alive between epochs (only applies when num_workers > 0).
            prefetch_factor: batches each worker loads ahead (only applies when num_workers > 0).
            drop_last: drop the last incomplete train batch of each epoch.
            val_fraction: fraction of all samples held out for validation.
            test_fraction: fraction of all samples held out for the final test.
            split_seed: seed of the train/val/test split, fixed apart from the run's seed so that runs with
                different seeds are scored on the same test set.
            predict_path: what ``predict`` runs on: a .npy/.csv file or a folder of images (see
                ``project/predict.py``); None = the test split.
        """
        super().__init__()
        if batch_size < 1:
            raise ConfigError(f"data.batch_size={batch_size!r}: the batch size must be >= 1.")
        if num_workers is not None and num_workers < 0:
            raise ConfigError(f"data.num_workers={num_workers!r}: the worker count must be >= 0.")
        if prefetch_factor < 1:
            raise ConfigError(f"data.prefetch_factor={prefetch_factor!r}: must be >= 1.")
        for key, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0.0 < value < 1.0:
                raise ConfigError(f"data.{key}={value!r}: a fraction must lie strictly between 0 and 1.")
        if val_fraction + test_fraction >= 1.0:
            raise ConfigError(
                f"data.val_fraction + data.test_fraction = {val_fraction + test_fraction!r}: "
                "together they must be < 1 to leave samples for training."
            )
        self.save_hyperparameters()
        self._train_loader: ResumableDataLoader | None = None
        self._train_loader_state: dict[str, int] | None = None
        self.train_set: DigitsDataset | None = None
        self.val_set: DigitsDataset | None = None
        self.test_set: DigitsDataset | None = None
        self.predict_set: DigitsDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if stage == "predict" and self.hparams["predict_path"] and self.predict_set is None:
            images = load_inputs(self.hparams["predict_path"])
            self.predict_set = DigitsDataset(images, torch.full((len(images),), -1, dtype=torch.int64))
        if self.train_set is not None:
            return
        images, labels = load_digits_tensors()
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.hparams["split_seed"]))
        n_val = math.ceil(len(order) * self.hparams["val_fraction"])
        n_test = math.ceil(len(order) * self.hparams["test_fraction"])
        val, test, train = order[:n_val], order[n_val : n_val + n_test], order[n_val + n_test :]
        self.train_set = DigitsDataset(images[train], labels[train])
        self.val_set = DigitsDataset(images[val], labels[val])
        self.test_set = DigitsDataset(images[test], labels[test])

    def _world(self) -> tuple[int, int]:
        return (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)

    def _loader(
        self, dataset: Dataset, sampler: Sampler, loader_class: type[DataLoader] = DataLoader, **kwargs: Any
    ) -> DataLoader:
        workers = self.hparams["num_workers"]
        if workers is None:
            per_machine = self.trainer.num_devices if self.trainer else 1
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            workers = min(8, max(1, cores // per_machine))
        pin = self.hparams["pin_memory"]
        if pin is None:
            pin = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        return loader_class(
            dataset,
            batch_size=self.hparams["batch_size"],
            sampler=sampler,
            num_workers=workers,
            pin_memory=pin,
            persistent_workers=self.hparams["persistent_workers"] and workers > 0,
            prefetch_factor=self.hparams["prefetch_factor"] if workers > 0 else None,
            # Worker seeds are drawn from this generator, not from the global RNG, which stays untouched by
            # loaders (its state is checkpointed for dropout; see project/rng.py).
            generator=torch.Generator().manual_seed(_run_seed()),
            **kwargs,
        )

    def train_dataloader(self) -> DataLoader:
        assert self.train_set is not None, "call setup() first"
        world_size, rank = self._world()
        # drop_last=True on the sampler: with several processes the tail that does not divide evenly is dropped
        # (a different one each epoch) instead of padded with repeated samples. One process drops nothing.
        sampler = ResumableSampler(
            self.train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=_run_seed(), drop_last=True
        )
        loader = self._loader(self.train_set, sampler, ResumableDataLoader, drop_last=self.hparams["drop_last"])
        assert isinstance(loader, ResumableDataLoader)
        if self._train_loader_state is not None:
            loader.load_state_dict(self._train_loader_state)
            self._train_loader_state = None
        self._train_loader = loader
        return loader

    # The position in the epoch travels in the checkpoint through the DataModule's own state, which Lightning
    # restores before anything asks for a loader. Lightning's restore of stateful loaders is skipped when the
    # loader was built early, as configure_optimizers does by reading estimated_stepping_batches.
    def state_dict(self) -> dict[str, Any]:
        return {"train_loader": self._train_loader.state_dict()} if self._train_loader is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._train_loader_state = state.get("train_loader")

    def _eval_loader(self, dataset: DigitsDataset | None) -> DataLoader:
        assert dataset is not None, "call setup() first"
        world_size, rank = self._world()
        if len(dataset) < world_size:
            raise ConfigError(f"An evaluation split of {len(dataset)} samples cannot feed {world_size} processes.")
        return self._loader(dataset, UnpaddedDistributedSampler(dataset, world_size, rank))

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_set)

    def predict_dataloader(self) -> DataLoader:
        return self._eval_loader(self.predict_set if self.predict_set is not None else self.test_set)

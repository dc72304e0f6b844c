"""The engine every DataModule gets: the train/val/test split, every DataLoader setting, the samplers (seeded and
sharded across processes, resumable mid-epoch, unpadded for evaluation), and the normalisation. A DataModule for
your data subclasses ``DataModule`` and only says what the data is (see ``project/data/``, and docs/your-own.md,
"Make it yours").

The contract a subclass declares, which everything downstream reads (the net's shapes, the task, ``predict``,
``export``'s ``model.json``, the notebooks, the tests) instead of knowing the data:

- ``target_kind`` and ``target_names``: what the targets are. ``"classes"``: each target is an int64 class index,
  ``target_names`` one name per class in index order. ``"values"``: each target is a float32 vector of real
  values, ``target_names`` one name per value (e.g. the CSV columns). The net has one output per name;
- ``input_shape``: one sample's shape, e.g. (C, H, W) or (features,), or (block_size,) for token sequences (the
  longest a sample may be: sequences may be shorter); ``input_dtype``: float32 (the default) or int64 (token ids,
  each < ``len(vocabulary)``); ``input_names`` (optional): the name of each input value, in order (a table's
  feature columns); ``vocabulary`` (token inputs): the name of each token id;
- targets that count for nothing (padding) are ``project.engine.task.IGNORE_INDEX``; variable-length samples are
  batched by ``collate_fn`` (e.g. padded to the batch's longest);
- ``load_dataset()``: every sample with its target (split here by ``split_seed``), or ``load_splits()`` for your
  own split;
- ``load_predict_inputs(path)``: one input file or folder decoded to samples, exactly as training decodes them;
  it may set ``predict_columns`` (column name: one string per input), carried into the prediction file so that its
  rows join back to the inputs (the file each came from, a table's ID columns); ``test_columns`` the same for the
  test split's samples, when predict runs on it;
- ``show(sample, ax)``: how a person looks at one sample (an image, or a bar per feature).

Normalisation (float inputs only: token ids are never standardised): with ``normalize=True`` the mean and standard
deviation per channel (per feature for tables) are computed on the training split only, kept in the DataModule's state
(plain lists of floats, so a checkpoint still loads with ``weights_only=True``), and applied to every batch after it
reaches the device. Datasets, and ``load_predict_inputs``, stay in raw units; ``export`` builds the normalisation into
the exported model.

A run is portable: what the DataModule learned from the training data that reading new inputs needs (the
attributes ``learned`` names: the class names, the shapes, a table's columns, a tokenizer) is kept in the checkpoint
as plain data, with a few test inputs and their targets (``EXAMPLES``: export's parity check, the inspect notebook
where the data is not). ``predict`` on files and ``export`` rebuild the DataModule from them (``restored()`` is then
true, and the subclass's ``__init__`` reads nothing of the training data), so a run directory copied to a machine
without that data still predicts and exports the same.
"""

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, Subset, TensorDataset

from project.engine.errors import ConfigError
from project.engine.resumable import ResumableDataLoader, ResumableSampler

# At most this many training samples (a seeded random subset) are read to compute the normalisation.
NORMALIZATION_SAMPLES = 10_000
# The first this many test inputs travel in the checkpoint: export checks its parity on them, data or no data.
EXAMPLES = 32

# The learned attributes of the DataModule being rebuilt from a checkpoint (``restoring``); None otherwise.
_RESTORING: ContextVar[dict[str, Any] | None] = ContextVar("restoring", default=None)


@contextmanager
def restoring(learned: dict[str, Any] | None) -> Iterator[None]:
    """DataModules built inside take their ``learned`` attributes from ``learned`` (a checkpoint's) instead of the
    training data; with None, nothing changes."""
    token = _RESTORING.set(learned)
    try:
        yield
    finally:
        _RESTORING.reset(token)


def learned_in(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The learned attributes a checkpoint keeps for its DataModule (None for a run trained before they were)."""
    class_path = (checkpoint.get("datamodule_hyper_parameters") or {}).get("_class_path", "")
    state = checkpoint.get(class_path.rpartition(".")[2]) or {}  # Lightning keys it by the class's __qualname__
    return state.get("learned") if isinstance(state, dict) else None


class UnpaddedDistributedSampler(DistributedSampler):
    """Evaluation sampler giving rank r the samples r, r+W, r+2W, ...: every sample is seen exactly once.

    torch's DistributedSampler pads the index list with repeats so every rank gets the same count, and
    torchmetrics does not remove them, so DDP val/test metrics would be biased. Uneven
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


class DataModule(L.LightningDataModule):
    """Samples with targets, split train/val/test by a fixed seed and served to one or many processes. Subclasses
    set ``target_names`` (and ``target_kind`` unless they are classes) and ``input_shape`` in ``__init__`` and
    implement ``load_dataset``.

    ``batch_size`` is per process: the global batch is batch_size x devices x num_nodes x accumulate_grad_batches.
    The train sampler is a seeded ``DistributedSampler`` on every run, one process included, so the sample order
    depends only on the run's seed and the epoch (Lightning calls ``set_epoch``), never on global RNG state; the
    train loader is resumable mid-epoch (``project/engine/resumable.py``).
    """

    target_kind: Literal["classes", "values"] = "classes"
    target_names: list[str]
    input_shape: tuple[int, ...]
    input_dtype: torch.dtype = torch.float32
    input_names: list[str] | None = None  # what each input value is, where it has a name (a table's columns)
    vocabulary: list[str] | None = None  # token inputs: what each id is
    collate_fn: Any = None  # how samples become a batch (None: torch's default, stacking same-shaped samples)
    # What reading new inputs needs that the training data taught (plain data: lists, strings, numbers, tuples):
    # kept in the checkpoint; a subclass adds what it learns (a table's categories, a tokenizer).
    learned: tuple[str, ...] = ("target_kind", "target_names", "input_shape", "input_names", "vocabulary")

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
        normalize: bool | Literal["train"] = True,
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
            normalize: standardise inputs with the mean/std per channel (or feature): those the net declares it
                expects (``input_statistics``: a pretrained backbone's), else the training split's; ``train``: the
                training split's in any case; false: raw inputs.
            predict_path: what ``predict`` runs on: a file or folder that ``load_predict_inputs`` reads; None =
                the test split.
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
        # Collects the subclass's own arguments too (Lightning walks the chain of __init__ frames).
        self.save_hyperparameters()
        self._train_loader: ResumableDataLoader | None = None
        self._train_loader_state: dict[str, int] | None = None
        self._normalization: dict[str, list[float]] | None = None
        self._norm_tensors: tuple[Tensor, Tensor] | None = None
        # What the net expects its inputs to be normalised with ({"mean": [...], "std": [...]}), where it says
        # (a pretrained backbone: its pretraining's); the engine hands it over before fit.
        self.expected_normalization: dict[str, list[float]] | None = None
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self.predict_set: Dataset | None = None
        self.predict_columns: dict[str, list[str]] = {}  # carried into the prediction file, one value per input
        self.test_columns: dict[str, list[str]] = {}  # the same for the test split's samples, in its order
        self._examples: tuple[Tensor, Tensor] | None = None
        self._restored = _RESTORING.get()

    def restored(self) -> bool:
        """True when this DataModule is rebuilt from a checkpoint to read new inputs (``predict`` on files,
        ``export``): its ``learned`` attributes are then set from the checkpoint, here, and a subclass's ``__init__``
        must read nothing of the training data (which may not be on this machine)."""
        if self._restored is None:
            return False
        for name, value in self._restored.items():
            setattr(self, name, value)
        return True

    # ---- what a subclass provides -------------------------------------------------------------------------------

    @property
    def num_outputs(self) -> int:
        """The net's outputs: one per class, or one per value."""
        return len(self.target_names)

    def load_dataset(self) -> Dataset:
        """Every sample: ``dataset[i]`` is (float32 tensor shaped ``input_shape``, its target as ``target_kind``
        says: an int64 class index, or a float32 vector of ``len(target_names)`` values)."""
        raise NotImplementedError(f"{type(self).__name__} must implement load_dataset() (or load_splits()).")

    def load_splits(self) -> tuple[Dataset, Dataset, Dataset]:
        """(train, val, test). By default a seeded random split of ``load_dataset()``; override it when your data
        comes already split."""
        dataset = self.load_dataset()
        train, val, test = self.split_indices(len(dataset))  # type: ignore[arg-type]
        return Subset(dataset, train), Subset(dataset, val), Subset(dataset, test)

    def split_indices(self, count: int) -> tuple[list[int], list[int], list[int]]:
        """The sample indices of (train, val, test) that ``load_splits`` takes out of ``count`` samples: for a
        DataModule that learns something from the training split before its samples exist (a table's categories)."""
        order = torch.randperm(count, generator=torch.Generator().manual_seed(self.hparams["split_seed"]))
        n_val = math.ceil(count * self.hparams["val_fraction"])
        n_test = math.ceil(count * self.hparams["test_fraction"])
        val, test, train = order[:n_val], order[n_val : n_val + n_test], order[n_val + n_test :]
        return train.tolist(), val.tolist(), test.tolist()

    def load_predict_inputs(self, path: Path) -> Tensor:
        """The inputs in ``path`` for ``predict``, shaped (N, *input_shape), in the same raw units as the training
        samples (a subclass may return a Dataset of (input, -1) pairs instead, for inputs of different lengths).
        Here: a .npy array of N samples (each of ``input_shape`` or flattened); subclasses read more."""
        if path.suffix != ".npy" or not path.is_file():
            raise ConfigError(f"data.predict_path={str(path)!r}: expected a .npy file of N x {self.input_shape}.")
        return self.check_predict_inputs(path, np.load(path, allow_pickle=False))

    def run_files(self) -> dict[str, str]:
        """Files (name: text) written into a run's directory when ``fit`` starts: what reading new inputs needs
        beside the checkpoint, for tools outside this code (a tokenizer's ``tokenizer.json``). None by default."""
        return {}

    def input_description(self) -> dict[str, Any]:
        """What ``model.json`` says, beside the input's shape, dtype and what the DataModule learned, about turning
        raw inputs into the exported model's (e.g. a prompt's token ids); nothing by default."""
        return {}

    def show(self, sample: Tensor, ax: Any) -> None:
        """Draws one raw sample on a matplotlib Axes: an image for (C, H, W) inputs, a bar per feature otherwise."""
        if sample.ndim == 3:
            image = sample.permute(1, 2, 0).clamp(0, 1).numpy()
            ax.imshow(image[..., 0] if image.shape[-1] == 1 else image[..., :3], cmap="gray")
            ax.set_axis_off()
        else:
            ax.bar(range(sample.numel()), sample.flatten().numpy())
            ax.set_xticks([])

    # ---- the engine -----------------------------------------------------------------------------------------------

    def check_predict_inputs(self, path: Path, values: Any) -> Tensor:
        """``values`` as ``input_dtype`` (N, *input_shape), or a ``ConfigError`` naming ``path`` and the shape (and, for
        token ids, the range) expected."""
        values = np.asarray(values)
        flat = math.prod(self.input_shape)
        if (
            values.ndim < 2
            or len(values) == 0
            or (values.shape[1:] != self.input_shape and values.shape[1:] != (flat,))
        ):
            raise ConfigError(
                f"data.predict_path={str(path)!r} holds an array shaped {values.shape}; expected N >= 1 samples "
                f"shaped {self.input_shape} (or rows of {flat} values)."
            )
        if not self.input_dtype.is_floating_point:
            ids = self.vocabulary or []
            if values.dtype.kind not in "iu" or values.min() < 0 or values.max() >= len(ids):
                raise ConfigError(
                    f"data.predict_path={str(path)!r}: token ids must be integers in [0, {len(ids)}), found "
                    f"{values.dtype} values in [{values.min()}, {values.max()}]."
                )
            return torch.as_tensor(values, dtype=self.input_dtype).reshape(-1, *self.input_shape)
        inputs = torch.as_tensor(values, dtype=torch.float32).reshape(-1, *self.input_shape)
        if not torch.isfinite(inputs).all():
            raise ConfigError(f"data.predict_path={str(path)!r}: the values must be finite (found NaN or inf).")
        return inputs

    def setup(self, stage: str | None = None) -> None:
        if stage == "predict" and self.hparams["predict_path"] and self.predict_set is None:
            path = Path(self.hparams["predict_path"])
            if not path.exists():
                raise ConfigError(f"data.predict_path={str(path)!r}: no such file or folder.")
            inputs = self.load_predict_inputs(path)  # no targets: -1
            self.predict_set = (
                TensorDataset(inputs, torch.full((len(inputs),), -1, dtype=torch.int64))
                if isinstance(inputs, Tensor) else inputs
            )  # fmt: skip
        # Predicting on files needs no split: the training data need not be on this machine.
        if self.train_set is None and not (stage == "predict" and self.predict_set is not None):
            self.train_set, self.val_set, self.test_set = self.load_splits()
        if stage == "fit":
            self.normalization  # noqa: B018  (computed now, before training starts, unless a checkpoint restores it)

    def _split(self, split: str) -> Dataset:
        if self.train_set is None:
            self.setup("fit")
        dataset = {"train": self.train_set, "val": self.val_set, "test": self.test_set}[split]
        assert dataset is not None
        return dataset

    def split_tensors(self, split: str, limit: int | None = None) -> tuple[Tensor, Tensor]:
        """A whole split (or its first ``limit`` samples) as (raw inputs, targets) stacked in memory (padded to the
        longest by ``collate_fn``, if any), targets in their own dtype: for notebooks, export and tests."""
        dataset = self._split(split)
        count = len(dataset) if limit is None else min(limit, len(dataset))  # type: ignore[arg-type]
        samples = [dataset[i] for i in range(count)]
        if self.collate_fn is not None:  # samples of different lengths, batched as the loaders batch them
            return self.collate_fn(samples)
        xs, ys = zip(*samples, strict=True)
        return torch.stack(xs), torch.stack([torch.as_tensor(y) for y in ys])

    def split_targets(self, split: str) -> Tensor:
        """A whole split's targets alone, stacked in their own dtype (a task's statistics of them), without decoding
        the inputs when the split is a subset of in-memory tensors."""
        dataset = self._split(split)
        if isinstance(dataset, Subset) and isinstance(dataset.dataset, TensorDataset):
            return dataset.dataset.tensors[1][list(dataset.indices)]
        return torch.stack([torch.as_tensor(dataset[i][1]) for i in range(len(dataset))])  # type: ignore[arg-type]

    @property
    def normalization(self) -> dict[str, list[float]] | None:
        """{"mean": [...], "std": [...]} per channel (feature), from the training split; None without ``normalize``.
        Computed on first use unless a checkpoint restored it; always None for token ids."""
        if not self.input_dtype.is_floating_point:
            return None
        if self.hparams["normalize"] and self._normalization is None:
            expected = self.expected_normalization if self.hparams["normalize"] is True else None
            self._normalization = self._declared(expected) if expected else self._compute_normalization()
        return self._normalization

    def _declared(self, stats: dict[str, list[float]]) -> dict[str, list[float]]:
        """The net's expected statistics, per channel of these inputs: RGB statistics for one grayscale channel
        are averaged (as timm sums an RGB stem's kernels into a one-channel one)."""
        channels = self.input_shape[0]
        mean, std = list(stats["mean"]), list(stats["std"])
        if len(mean) != channels and channels == 1:
            mean, std = [sum(mean) / len(mean)], [sum(std) / len(std)]
        if len(mean) != channels or len(std) != channels:
            raise ConfigError(
                f"The net expects inputs normalised with {len(mean)} channel statistics but the data has {channels} "
                "channels: set data.normalize=train (the training split's statistics) or false."
            )
        return {"mean": mean, "std": std}

    def _compute_normalization(self) -> dict[str, list[float]]:
        if self.train_set is None:
            self.setup("fit")
        assert self.train_set is not None
        n = len(self.train_set)  # type: ignore[arg-type]
        picked = torch.randperm(n, generator=torch.Generator().manual_seed(self.hparams["split_seed"]))
        subset = Subset(self.train_set, sorted(picked[:NORMALIZATION_SAMPLES].tolist()))
        channels = self.input_shape[0]
        total, total_sq, count = (
            torch.zeros(channels, dtype=torch.float64),
            torch.zeros(channels, dtype=torch.float64),
            0,
        )
        # A generator of its own: an iterator over a loader without one draws its worker seed from the global
        # RNG, which would shift every later dropout mask of the run depending on whether inputs are normalised.
        loader = DataLoader(subset, batch_size=256, num_workers=self._workers(), generator=torch.Generator())
        for x, _ in loader:
            x = x.double().transpose(0, 1).flatten(1)  # (channel or feature, everything else)
            total, total_sq, count = total + x.sum(1), total_sq + (x * x).sum(1), count + x.shape[1]
        mean = total / count
        std = (total_sq / count - mean * mean).clamp_min(0).sqrt().clamp_min(1e-6)  # a constant input stays finite
        return {"mean": mean.tolist(), "std": std.tolist()}

    def normalize(self, x: Tensor) -> Tensor:
        """Raw inputs -> what the net sees (identity without ``normalize``)."""
        stats = self.normalization
        if stats is None:
            return x
        if self._norm_tensors is None or self._norm_tensors[0].device != x.device:
            view = (-1,) + (1,) * (len(self.input_shape) - 1)
            self._norm_tensors = tuple(  # type: ignore[assignment]
                torch.tensor(stats[k], dtype=torch.float64, device=x.device).view(view) for k in ("mean", "std")
            )
        mean, std = self._norm_tensors  # type: ignore[misc]
        return (x - mean.to(x.dtype)) / std.to(x.dtype)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        x, y = batch
        return self.normalize(x), y

    def _world(self) -> tuple[int, int]:
        return (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)

    def _workers(self) -> int:
        workers = self.hparams["num_workers"]
        if workers is None:
            per_machine = self.trainer.num_devices if self.trainer else 1
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            workers = min(8, max(1, cores // per_machine))
        return workers

    def _loader(
        self, dataset: Dataset, sampler: Sampler, loader_class: type[DataLoader] = DataLoader, **kwargs: Any
    ) -> DataLoader:
        workers = self._workers()
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
            # loaders (its state is checkpointed for dropout; see project/engine/rng.py).
            generator=torch.Generator().manual_seed(_run_seed()),
            collate_fn=self.collate_fn,
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
    # loader was built early, as configure_optimizers does by reading estimated_stepping_batches. The
    # normalisation travels the same way, so test/predict/export of a checkpoint use the statistics it trained with.
    def state_dict(self) -> dict[str, Any]:
        examples, targets = self.examples()
        state: dict[str, Any] = {
            "normalization": self.normalization,
            "learned": {name: getattr(self, name) for name in self.learned},
            "examples": examples,
            "example_targets": targets,
        }
        if self._train_loader is not None:
            state["train_loader"] = self._train_loader.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._train_loader_state = state.get("train_loader")
        if state.get("normalization") is not None:
            self._normalization, self._norm_tensors = state["normalization"], None
        if state.get("examples") is not None and state.get("example_targets") is not None:
            self._examples = state["examples"], state["example_targets"]

    def examples(self) -> tuple[Tensor, Tensor]:
        """The first ``EXAMPLES`` test inputs, raw, and their targets (the checkpoint's, when it was restored from
        one): what export checks its parity on, and what the inspect notebook scores where the data is not."""
        if self._examples is None:
            self._examples = self.split_tensors("test", EXAMPLES)
        return self._examples

    def _eval_loader(self, dataset: Dataset | None) -> DataLoader:
        assert dataset is not None, "call setup() first"
        world_size, rank = self._world()
        if len(dataset) < world_size:  # type: ignore[arg-type]
            raise ConfigError(f"An evaluation split of {len(dataset)} samples cannot feed {world_size} processes.")  # type: ignore[arg-type]
        return self._loader(dataset, UnpaddedDistributedSampler(dataset, world_size, rank))

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_set)

    def predict_dataloader(self) -> DataLoader:
        return self._eval_loader(self.predict_set if self.predict_set is not None else self.test_set)

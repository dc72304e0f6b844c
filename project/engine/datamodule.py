"""The base of every DataModule: the split, the loaders (``loaders.py``, ``samplers.py``) and the normalisation
(``normalization.py``). Yours subclasses it, declares what the data is in the class attributes below (everything
downstream reads them), and reads it: ``load_dataset()`` (split here by ``split_seed``) or ``load_splits()``,
``load_predict_inputs(path)`` (a file or folder decoded as training decodes its samples, with ``predict_columns``,
``test_columns`` for the test split, carried into the prediction file so its rows join back to the inputs), and
``show(sample, ax)`` to look at one.

A sample is ``(inputs, targets)``, or the inputs alone without targets (``batches.py``). Several inputs are named:
a sample's inputs are a dict (name: tensor), ``input_shape`` (and ``input_dtype`` where they differ) a dict of the
same names. Padding targets are ``metrics.IGNORE_INDEX``. Float inputs are standardised on the device, each input
with statistics of its own (datasets stay in raw units; ``export`` builds it into the model); what reading new
inputs needs is kept in the checkpoint (``portable.py``).
"""

import math
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset, default_collate

from project.engine.batches import check_sample, named
from project.engine.errors import ConfigError
from project.engine.loaders import check_loader_settings, eval_loader, train_loader
from project.engine.normalization import normalize, statistics_for
from project.engine.portable import EXAMPLES, being_restored, load_state, restore_learned, state_of
from project.engine.predict import check_inputs, read_predict_set
from project.engine.samplers import ResumableDataLoader


class DataModule(L.LightningDataModule):
    """Samples with targets, split by a fixed seed, served to one or many processes in the seed and epoch's order."""

    target_kind: Literal["classes", "values"] | None = "classes"  # None: no targets, a sample is its inputs
    target_names: list[str]  # a name per class, or per value (a table's target columns): one output of the net each
    # One sample's shape: (C, H, W), (features,), (block_size,) for token ids; named inputs: a dict, name: shape.
    input_shape: Any
    input_dtype: Any = torch.float32  # float32, or int64 token ids below len(vocabulary); named inputs: a dict
    input_names: list[str] | None = None  # what each input value is, where it has a name (a table's columns)
    vocabulary: list[str] | None = None  # token inputs: what each id is
    collate_fn: Any = None  # how samples become a batch (None: torch's default, stacking same-shaped samples)
    train_set: Dataset | None
    val_set: Dataset | None
    test_set: Dataset | None
    predict_set: Dataset | None
    # What reading new inputs needs that the training data taught, kept in the checkpoint (a subclass adds its own).
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
        eval_samples: int | None = None,
        normalize: bool | Literal["train"] = True,
        predict_path: str | None = None,
    ) -> None:
        """
        Args:
            batch_size: samples per batch per process (the global batch: x devices x nodes x accumulation).
            num_workers: DataLoader workers (0: in the training process; None: the cores shared out, at most 8).
            pin_memory: page-locked host memory for host-to-GPU copies; None: on when training on CUDA.
            persistent_workers: keep workers alive between epochs (with num_workers > 0).
            prefetch_factor: batches each worker loads ahead (with num_workers > 0).
            drop_last: drop the last incomplete train batch of each epoch.
            val_fraction: fraction of all samples held out for validation.
            test_fraction: fraction of all samples held out for the final test.
            split_seed: the split's seed, apart from the run's, so runs of other seeds share one test set.
            eval_samples: at most this many samples of the validation and the test split are evaluated, evenly spaced
                over each, the same ones every time (the loss's standard error is logged beside it); None: all.
            normalize: standardise inputs per channel (or feature) with the statistics the net expects (a pretrained
                backbone's ``input_statistics``), else the training split's; ``train``: the training split's; false.
            predict_path: what ``predict`` runs on (a file or folder for ``load_predict_inputs``); None: the test split.
        """
        super().__init__()
        check_loader_settings(batch_size, num_workers, prefetch_factor, val_fraction, test_fraction, eval_samples)
        self.save_hyperparameters()  # the subclass's own arguments too (Lightning walks the __init__ frames)
        self._train_loader: ResumableDataLoader | None = None
        self._train_loader_state: dict[str, int] | None = None
        self._normalization: dict[str, Any] | None = None
        self._norm_tensors: dict[str | None, tuple[Tensor, Tensor]] = {}
        self.expected_normalization: dict[str, list[float]] | None = None  # a pretrained net's, handed over by the CLI
        self.train_set = self.val_set = self.test_set = self.predict_set = None
        if not hasattr(self, "target_names"):  # data without targets has no names (a subclass sets its own after)
            self.target_names: list[str] = []
        self.predict_columns: dict[str, list[str]] = {}  # carried into the prediction file, one value per input
        self.test_columns: dict[str, list[str]] = {}  # the same for the test split's samples, in its order
        self._examples: tuple[Any, Tensor | None] | None = None
        self._restored = being_restored()

    def restored(self) -> bool:
        """Rebuilt from a checkpoint (``predict`` on files, ``export``): ``learned`` is set, read no training data."""
        return restore_learned(self, self._restored)

    # ---- what a subclass provides -------------------------------------------------------------------------------

    @property
    def num_outputs(self) -> int:  # the net's outputs: one per class, or one per value (0 without targets)
        return len(self.target_names) if self.target_kind is not None else 0

    @property
    def named_inputs(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """Several inputs: name: (shape, dtype); None for one input tensor."""
        return named(self.input_shape, self.input_dtype)

    def inputs_of(self, batch: Any) -> Any:
        """A sample's or batch's inputs: the first of (inputs, targets), or all of it without targets."""
        return batch if self.target_kind is None else batch[0]

    def load_dataset(self) -> Dataset:
        """Every sample: ``dataset[i]`` is (its inputs, its target as ``target_kind`` says), or its inputs alone
        without targets; the inputs a tensor shaped ``input_shape``, or a dict of them for several named inputs."""
        raise NotImplementedError(f"{type(self).__name__} must implement load_dataset() (or load_splits()).")

    def load_splits(self) -> tuple[Dataset, Dataset, Dataset]:
        """(train, val, test): a seeded random split of ``load_dataset()``, or your data's own split."""
        dataset = self.load_dataset()
        train, val, test = self.split_indices(len(dataset))  # type: ignore[arg-type]
        return Subset(dataset, train), Subset(dataset, val), Subset(dataset, test)

    def split_indices(self, count: int) -> tuple[list[int], list[int], list[int]]:
        """The (train, val, test) indices ``load_splits`` takes of ``count`` samples (a table learns from train's)."""
        order = torch.randperm(count, generator=torch.Generator().manual_seed(self.hparams["split_seed"]))
        n_val = math.ceil(count * self.hparams["val_fraction"])
        n_test = math.ceil(count * self.hparams["test_fraction"])
        val, test, train = order[:n_val], order[n_val : n_val + n_test], order[n_val + n_test :]
        return train.tolist(), val.tolist(), test.tolist()

    def load_predict_inputs(self, path: Path) -> Any:
        """``path``'s inputs, (N, *input_shape) in the training samples' raw units (or a Dataset of (input, -1) pairs
        for inputs of different lengths; a dict of tensors for several named inputs). Here: a .npy array, or for
        several named inputs a .npz file with an array per name (``numpy.savez``); subclasses read more."""
        suffix = ".npz" if self.named_inputs else ".npy"
        if path.suffix != suffix or not path.is_file():
            raise ConfigError(f"data.predict_path={str(path)!r}: expected a {suffix} file of N x {self.input_shape}.")
        return self.check_predict_inputs(path, np.load(path, allow_pickle=False))

    def run_files(self) -> dict[str, str]:
        """Files (name: text) for the run's directory at ``fit``, for tools outside this code (``tokenizer.json``)."""
        return {}

    def input_description(self) -> dict[str, Any]:
        """What ``model.json`` says about turning raw inputs into the exported model's (a prompt's token ids)."""
        return {}

    def show(self, sample: Any, ax: Any) -> None:
        """Draws one raw sample's inputs on a matplotlib Axes: an image for (C, H, W) inputs, a bar per feature
        otherwise (of several named inputs, the first)."""
        if isinstance(sample, dict):
            sample = next(iter(sample.values()))
        if sample.ndim == 3:
            image = sample.permute(1, 2, 0).clamp(0, 1).numpy()
            ax.imshow(image[..., 0] if image.shape[-1] == 1 else image[..., :3], cmap="gray")
            ax.set_axis_off()
        else:
            ax.bar(range(sample.numel()), sample.flatten().numpy())
            ax.set_xticks([])

    # ---- the engine -----------------------------------------------------------------------------------------------

    def check_predict_inputs(self, path: Path, values: Any) -> Any:
        """``values`` as ``input_dtype`` (N, *input_shape), or a ``ConfigError`` naming ``path`` and what fits; for
        several named inputs, a mapping of arrays with one per name."""
        return check_inputs(path, values, self.input_shape, self.input_dtype, self.vocabulary, self.named_inputs)

    def setup(self, stage: str | None = None) -> None:
        if stage == "predict" and self.hparams["predict_path"] and self.predict_set is None:
            self.predict_set = read_predict_set(self, Path(self.hparams["predict_path"]))
        # Predicting on files needs no split: the training data need not be on this machine.
        if self.train_set is None and not (stage == "predict" and self.predict_set is not None):
            self.train_set, self.val_set, self.test_set = self.load_splits()
        if stage == "fit":
            check_sample(self, self.train_set[0])  # type: ignore[index]
            self.normalization  # noqa: B018  (computed now, before training starts, unless a checkpoint restores it)

    def _split(self, split: str) -> Dataset:
        if self.train_set is None:
            self.setup("fit")
        dataset = {"train": self.train_set, "val": self.val_set, "test": self.test_set}[split]
        assert dataset is not None
        return dataset

    def split_tensors(self, split: str, limit: int | None = None) -> tuple[Any, Tensor | None]:
        """A split (or its first ``limit`` samples) as (raw inputs, targets) in memory, batched as the loaders batch
        them (``collate_fn``, else torch's ``default_collate``); targets None for data without."""
        dataset = self._split(split)
        count = len(dataset) if limit is None else min(limit, len(dataset))  # type: ignore[arg-type]
        batch = (self.collate_fn or default_collate)([dataset[i] for i in range(count)])
        return self.inputs_of(batch), None if self.target_kind is None else batch[1]

    def split_targets(self, split: str) -> Tensor | None:
        """A whole split's targets alone (without decoding the inputs, when they are in-memory tensors)."""
        if self.target_kind is None:
            return None
        dataset = self._split(split)
        if isinstance(dataset, Subset) and isinstance(dataset.dataset, TensorDataset):
            return dataset.dataset.tensors[1][list(dataset.indices)]
        return torch.stack([torch.as_tensor(dataset[i][1]) for i in range(len(dataset))])  # type: ignore[arg-type]

    @property
    def normalization(self) -> dict[str, Any] | None:
        """{"mean": [...], "std": [...]} per channel (feature); for several named inputs, name: that (float inputs
        only); None without ``normalize``, and for token ids. Computed on first use (the net's expected statistics,
        else the training split's) unless a checkpoint restored it."""
        inputs = self.named_inputs
        floats = [d for _, d in inputs.values()] if inputs else [self.input_dtype]
        if not any(d.is_floating_point for d in floats):
            return None
        if self.hparams["normalize"] and self._normalization is None:
            self._normalization = statistics_for(self)
        return self._normalization

    def normalize(self, inputs: Any) -> Any:
        """Raw inputs (one tensor, several named ones, or a tuple of such) -> what the net sees (identity without
        ``normalize``); a named input without statistics (token ids, a mask) passes unchanged."""
        stats = self.normalization
        return inputs if stats is None else normalize(inputs, stats, self._norm_tensors)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # (inputs, targets), or the inputs alone: data without targets, or the task's example_input_array for the
        # model summary (a batch of one: a tensor, or (inputs,) for named inputs).
        if self.target_kind is not None and isinstance(batch, list | tuple) and len(batch) == 2:
            return self.normalize(batch[0]), batch[1]
        return self.normalize(batch)

    def train_dataloader(self) -> DataLoader:
        assert self.train_set is not None, "call setup() first"
        self._train_loader = train_loader(self, self._train_loader_state)  # a resumed run's position, once
        self._train_loader_state = None
        return self._train_loader

    # The checkpoint keeps the epoch's position, the statistics, what reading inputs needs, examples (portable.py).
    def state_dict(self) -> dict[str, Any]:
        return state_of(self, self._train_loader)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_state(self, state)

    def examples(self) -> tuple[Any, Tensor | None]:
        """The first ``EXAMPLES`` test inputs, raw, with their targets (None without; a restored checkpoint's)."""
        if self._examples is None:
            self._examples = self.split_tensors("test", EXAMPLES)
        return self._examples

    def val_dataloader(self) -> DataLoader:
        return eval_loader(self, self.val_set, self.hparams["eval_samples"])

    def test_dataloader(self) -> DataLoader:
        return eval_loader(self, self.test_set, self.hparams["eval_samples"])

    def predict_dataloader(self) -> DataLoader:
        return eval_loader(self, self.predict_set if self.predict_set is not None else self.test_set)

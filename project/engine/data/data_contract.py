"""What a DataModule says its data is, which everything downstream reads: the class attributes below, and how it reads
the data: ``load_dataset()`` (split here by ``split_seed``) or ``load_splits()``,
``load_predict_inputs(path)`` (a file or folder decoded as training decodes its samples, with ``predict_columns``,
``test_columns`` for the test split, carried into the prediction file so its rows join back to the inputs), and
``show(sample, ax)`` to look at one.

A sample is ``(inputs, targets)``, or the inputs alone without targets (``batches.py``). Several inputs are named:
a sample's inputs are a dict (name: tensor), ``input_shape`` (and ``input_dtype`` where they differ) a dict of the
same names. Padding targets are ``metrics.IGNORE_INDEX``. Float inputs are standardised on the device, each input
with statistics of its own (datasets stay in raw units; ``export`` builds it into the model); what reading new
inputs needs is kept in the checkpoint (``checkpointing/portable.py``).
"""

import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from project.engine.data.batches import named
from project.engine.data.predict_inputs import check_inputs
from project.engine.errors import ConfigError


class DataContract:
    """What a DataModule declares and provides (``DataModule`` is this and the engine): its class attributes and the
    methods below, each with the default a DataModule keeps unless it says otherwise."""

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

    hparams: Any  # the constructor's arguments (Lightning's)

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

    def check_predict_inputs(self, path: Path, values: Any) -> Any:
        """``values`` as ``input_dtype`` (N, *input_shape), or a ``ConfigError`` naming ``path`` and what fits; for
        several named inputs, a mapping of arrays with one per name."""
        return check_inputs(path, values, self.input_shape, self.input_dtype, self.vocabulary, self.named_inputs)

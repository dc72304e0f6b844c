"""The base of every DataModule: the split, the loaders (``loaders.py``, ``samplers.py``), the normalisation
(``normalization.py``), the checkpoint's state (``checkpointing/portable.py``). Yours subclasses it and says what
the data is and how to read it: what ``DataContract`` (``data_contract.py``) lists.
"""

from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset, default_collate

from project.engine.checkpointing.portable import EXAMPLES, being_restored, load_state, restore_learned, state_of
from project.engine.data.batches import check_sample
from project.engine.data.data_contract import DataContract
from project.engine.data.loaders import check_loader_settings, eval_loader, train_loader
from project.engine.data.normalization import normalize, statistics_for
from project.engine.data.predict_inputs import read_predict_set
from project.engine.data.samplers import ResumableDataLoader


class DataModule(DataContract, L.LightningDataModule):
    """Samples with targets, split by a fixed seed, served to one or many processes in the seed and epoch's order:
    what a subclass declares and provides is ``DataContract``'s."""

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

    # The checkpoint keeps the epoch's position, the statistics, what reading inputs needs, examples
    # (checkpointing/portable.py).
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

"""Writing a trained model's predictions to a CSV file. What ``predict`` reads (``data.predict_path``) is the
DataModule's business: its ``load_predict_inputs`` decodes your files exactly as training decodes its samples, and
``check_inputs`` refuses what does not fit the model in one sentence."""

import csv
import math
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from torch import Tensor
from torch.utils.data import Dataset

from project.engine import batches
from project.engine.errors import ConfigError
from project.engine.hooks import defined_hooks_only


@defined_hooks_only
class CSVPredictionWriter(BasePredictionWriter):
    """Writes ``index, [the DataModule's columns,] <the task's columns>`` per input, in input order (one process): the
    task's ``prediction_table`` says what a prediction is (e.g. the predicted class and the probabilities, or values
    in the targets' units); the DataModule's ``predict_columns`` are what it carries through from the inputs (the
    file each came from, a table's ID columns), so the rows can be joined back to them. Files a prediction
    has beside its row (a segmentation's masks) are the task's ``write_prediction_files``, into the CSV's folder.

    ``output`` null: ``predictions.csv`` in the run directory of the checkpoint predicted with (the working directory
    without one), unless another writer in the list names its own file (``make predict OUTPUT=`` adds one)."""

    def __init__(self, output: str | None = None) -> None:
        super().__init__(write_interval="epoch")
        self.output = output

    def write_on_epoch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, predictions: Any, batch_indices: Any
    ) -> None:
        writers = [cb for cb in trainer.callbacks if isinstance(cb, CSVPredictionWriter)]  # type: ignore[attr-defined]
        if self.output is None and any(w.output is not None for w in writers):
            return  # another writer names its own file
        ckpt = trainer.ckpt_path  # <run>/checkpoints/best.ckpt
        run_dir = Path(ckpt).resolve().parent.parent if ckpt else Path.cwd()
        output = Path(self.output) if self.output is not None else run_dir / "predictions.csv"
        outputs = torch.cat(list(predictions)).float()
        header, rows = pl_module.prediction_table(outputs)  # type: ignore[operator]
        dm = trainer.datamodule  # type: ignore[attr-defined]
        on_a_file = getattr(dm, "predict_set", None) is not None
        carried = getattr(dm, "predict_columns" if on_a_file else "test_columns", {})
        # a carried column named like one of ours (a table's own "prediction" column) is kept under another name
        carried = {(f"input.{k}" if k in ("index", *header) else k): v for k, v in carried.items()}
        output.parent.mkdir(parents=True, exist_ok=True)
        with open(output, "w", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")  # Unix line ends (the csv module writes \r\n)
            writer.writerow(["index", *carried, *header])
            for index, row in enumerate(rows):
                writer.writerow([index, *(values[index] for values in carried.values()), *row])
        pl_module.write_prediction_files(outputs, output.parent, dm)  # type: ignore[operator]
        print(f"Wrote {len(rows)} predictions to {output}")


def check_inputs(
    path: Path,
    values: Any,
    input_shape: tuple[int, ...],
    input_dtype: torch.dtype,
    vocabulary: list[str] | None,
    named: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None,
) -> Any:
    """``values`` as ``input_dtype`` (N, *input_shape), or a ``ConfigError`` naming ``path`` and the shape (and, for
    token ids, the range) expected; for several ``named`` inputs (name: (shape, dtype)), a mapping with an array
    per name, each checked so."""
    if named is not None:
        given = sorted(getattr(values, "files", None) or values)
        if given != sorted(named):
            raise ConfigError(
                f"data.predict_path={str(path)!r} holds the arrays {given}; expected one per input: {sorted(named)}."
            )
        return {n: check_inputs(path, values[n], shape, dtype, vocabulary) for n, (shape, dtype) in named.items()}
    values = np.asarray(values)
    flat = math.prod(input_shape)
    if values.ndim < 2 or len(values) == 0 or (values.shape[1:] != input_shape and values.shape[1:] != (flat,)):
        raise ConfigError(
            f"data.predict_path={str(path)!r} holds an array shaped {values.shape}; expected N >= 1 samples "
            f"shaped {input_shape} (or rows of {flat} values)."
        )
    if not input_dtype.is_floating_point:
        ids = vocabulary or []
        if values.dtype.kind not in "iu" or values.min() < 0 or values.max() >= len(ids):
            raise ConfigError(
                f"data.predict_path={str(path)!r}: token ids must be integers in [0, {len(ids)}), found "
                f"{values.dtype} values in [{values.min()}, {values.max()}]."
            )
        return torch.as_tensor(values, dtype=input_dtype).reshape(-1, *input_shape)
    inputs = torch.as_tensor(values, dtype=torch.float32).reshape(-1, *input_shape)
    if not torch.isfinite(inputs).all():
        raise ConfigError(f"data.predict_path={str(path)!r}: the values must be finite (found NaN or inf).")
    return inputs


class InputRows(Dataset):
    """Samples of decoded inputs (a tensor, or a dict of them: several named inputs), each shaped as the training
    samples are: (inputs, -1) where the data has targets (none known), the inputs alone where it has none."""

    def __init__(self, inputs: Tensor | dict[str, Tensor], with_targets: bool) -> None:
        self.inputs, self.with_targets = inputs, with_targets

    def __len__(self) -> int:
        return batches.size(self.inputs)

    def __getitem__(self, i: int) -> Any:
        sample = batches.each(self.inputs, lambda t: t[i])
        return (sample, torch.tensor(-1)) if self.with_targets else sample


def read_predict_set(datamodule: Any, path: Path) -> Dataset:
    """What ``predict`` runs on: the inputs ``datamodule.load_predict_inputs`` decodes from ``path`` (a tensor, or a
    dict of them for several named inputs, or a Dataset of its own), with no targets (-1)."""
    if not path.exists():
        raise ConfigError(f"data.predict_path={str(path)!r}: no such file or folder.")
    inputs = datamodule.load_predict_inputs(path)
    if isinstance(inputs, Tensor | dict):
        return InputRows(inputs, datamodule.target_kind is not None)
    return inputs

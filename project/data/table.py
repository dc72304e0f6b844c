"""Your table, by config alone: a CSV file with a header row, numeric feature columns and the target column(s).

``target_type: class`` (classification): one target column of class names (``benign``/``malignant``) or integers;
the sorted distinct values are the classes, and their names are kept (``model.json``, the prediction CSV). A
column of real numbers is refused (it is a regression target: configs/tasks/regression.yaml).
``target_type: value`` (regression): one or several numeric target columns, kept as float32 values.

Features are standardised with the mean and standard deviation of the training split. Read with Python's csv
module: pandas is not needed to parse a file of numbers. ``predict`` reads a CSV with the same feature columns (by
name; the target columns may be absent).
"""

import csv
import math
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor
from torch.utils.data import Dataset, TensorDataset

from project.engine.datamodule import DataModule
from project.engine.errors import ConfigError


def read_table(path: Path, key: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of a CSV file; a ``ConfigError`` naming ``key`` (the config key) otherwise."""
    if not path.is_file():
        raise ConfigError(f"{key}={str(path)!r}: no such file.")
    with open(path, newline="") as f:
        rows = [row for row in csv.reader(f) if row]
    if len(rows) < 2:
        raise ConfigError(f"{key}={str(path)!r}: expected a header row and at least one data row.")
    header, body = [name.strip() for name in rows[0]], rows[1:]
    for number, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise ConfigError(f"{key}={str(path)!r}: row {number} has {len(row)} values, the header {len(header)}.")
    return header, body


def numeric_columns(path: Path, key: str, header: list[str], body: list[list[str]], columns: list[str]) -> Tensor:
    """The named columns as float32 (rows, columns); a ``ConfigError`` naming the column and row of a bad value."""
    index = [header.index(c) for c in columns]
    values = torch.empty(len(body), len(columns), dtype=torch.float32)
    for r, row in enumerate(body):
        for c, i in enumerate(index):
            try:
                value = float(row[i])
            except ValueError:
                value = math.nan if row[i].strip().lower() in ("", "nan", "na", "null") else None  # type: ignore[assignment]
                if value is None:
                    raise ConfigError(
                        f"{key}={str(path)!r}: column {columns[c]!r}, row {r + 2}: {row[i]!r} is not a number "
                        "(feature columns must be numeric)."
                    ) from None
            if not math.isfinite(value):
                raise ConfigError(
                    f"{key}={str(path)!r}: column {columns[c]!r}, row {r + 2} is missing or not finite ({row[i]!r}); "
                    "fill or drop such rows first."
                )
            values[r, c] = value
    return values


class CSVDataModule(DataModule):
    """Rows of a CSV file, split train/val/test by ``split_seed``."""

    learned = (*DataModule.learned, "features")

    def __init__(
        self,
        path: str,
        target: str | list[str],
        features: list[str] | None = None,
        target_type: Literal["class", "value"] = "class",
        **engine: Any,
    ) -> None:
        """
        Args:
            path: the CSV file (header row first).
            target: the column holding each row's class (``target_type: class``), or the column(s) of real values
                to predict (``target_type: value``).
            features: the input columns, in this order; None = every column but the target(s).
            target_type: ``class`` for a classification target, ``value`` for real-valued (regression) targets.
            **engine: the loader, split and normalisation settings of ``DataModule``.
        """
        super().__init__(**engine)
        self.path = Path(path)
        if self.restored():  # the columns and class names from the checkpoint: the file is not read
            return
        header, body = read_table(self.path, "data.path")
        targets = [target] if isinstance(target, str) else list(target)
        unknown_targets = [t for t in targets if t not in header]
        if unknown_targets or not targets:
            raise ConfigError(f"data.target={target!r}: not column(s) of {path!r}; its columns are {header}.")
        if target_type == "class" and len(targets) != 1:
            raise ConfigError(f"data.target={target!r}: classification takes one target column (target_type: class).")
        self.features = list(features) if features is not None else [c for c in header if c not in targets]
        unknown = [c for c in self.features if c not in header or c in targets]
        if unknown or not self.features:
            raise ConfigError(
                f"data.features: {unknown or 'none'} cannot be the inputs; choose among {header} except the target."
            )
        self.inputs = numeric_columns(self.path, "data.path", header, body, self.features)
        self.input_shape = (len(self.features),)
        self.input_names = self.features
        if target_type == "value":
            self.target_kind = "values"
            self.target_names = targets
            self.targets = numeric_columns(self.path, "data.path", header, body, targets)
        else:
            self.target_names, self.targets = class_labels(
                path, targets[0], [row[header.index(targets[0])] for row in body]
            )

    def load_dataset(self) -> Dataset:
        return TensorDataset(self.inputs, self.targets)

    def load_predict_inputs(self, path: Path) -> Tensor:
        if path.suffix == ".npy":
            return super().load_predict_inputs(path)
        header, body = read_table(path, "data.predict_path")
        missing = [c for c in self.features if c not in header]
        if missing:
            raise ConfigError(f"data.predict_path={str(path)!r} lacks the feature column(s) {missing}.")
        return numeric_columns(path, "data.predict_path", header, body, self.features)

    def show(self, sample: Tensor, ax: Any) -> None:
        ax.barh(range(len(self.features)), sample.numpy())
        ax.set_yticks(range(len(self.features)), self.features, fontsize=6)
        ax.invert_yaxis()


def class_labels(path: str, target: str, values: list[str]) -> tuple[list[str], Tensor]:
    """(class names, int64 class indices) of a target column; a ``ConfigError`` if it holds real numbers."""
    labels = [v.strip() for v in values]
    try:  # integer labels sort numerically (2 before 10), names alphabetically
        keys = [str(k) for k in map(int, labels)]
        names, integers = [str(k) for k in sorted({int(k) for k in keys})], True
    except ValueError:
        keys, names, integers = labels, sorted(set(labels)), False
        real = _real_number(labels)
        if real is not None:
            raise ConfigError(
                f"data.target={target!r} in {path!r} holds real numbers (e.g. {real}), not class labels: to predict "
                "a value, train a regressor: --config configs/tasks/regression.yaml (data.target_type: value)."
            ) from None
    if len(names) < 2:
        raise ConfigError(f"data.target={target!r}: the column holds {len(names)} class(es), at least 2 needed.")
    if integers and len(names) > max(20, len(labels) // 5):
        raise ConfigError(
            f"data.target={target!r} in {path!r} holds {len(names)} distinct integers in {len(labels)} rows (fewer "
            "than 5 rows per class): a value to predict rather than classes. Train a regressor: --config "
            "configs/tasks/regression.yaml (data.target_type: value); if they really are classes, write them as names."
        )
    position = {name: i for i, name in enumerate(names)}
    return names, torch.tensor([position[k] for k in keys])


def _real_number(labels: list[str]) -> str | None:
    """A value that shows the labels are real numbers rather than names: all parse as numbers, one is not whole."""
    try:
        numbers = [float(v) for v in labels]
    except ValueError:
        return None
    return next((v for v, x in zip(labels, numbers, strict=True) if not x.is_integer()), None)

"""Your table, by config alone: a CSV file with a header row, numeric feature columns and one target column.

The target may hold class names (``benign``/``malignant``) or integers; the sorted distinct values are the
classes, and their names are kept (``model.json``, the prediction CSV). Features are standardised with the mean
and standard deviation of the training split. Read with Python's csv module: pandas is not needed to parse a
file of numbers. ``predict`` reads a CSV with the same feature columns (by name; the target column may be absent).
"""

import csv
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset, TensorDataset

from project.data.base import ClassificationDataModule
from project.errors import ConfigError


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


class CSVDataModule(ClassificationDataModule):
    """Rows of a CSV file, split train/val/test by ``split_seed``."""

    def __init__(self, path: str, target: str, features: list[str] | None = None, **engine: Any) -> None:
        """
        Args:
            path: the CSV file (header row first).
            target: the column holding the class of each row.
            features: the input columns, in this order; None = every column but the target.
            **engine: the loader, split and normalisation settings of ``ClassificationDataModule``.
        """
        super().__init__(**engine)
        self.path = Path(path)
        header, body = read_table(self.path, "data.path")
        if target not in header:
            raise ConfigError(f"data.target={target!r} is not a column of {path!r}; its columns are {header}.")
        self.features = list(features) if features is not None else [c for c in header if c != target]
        unknown = [c for c in self.features if c not in header or c == target]
        if unknown or not self.features:
            raise ConfigError(
                f"data.features: {unknown or 'none'} cannot be the inputs; choose among {header} except the target."
            )
        self.inputs = numeric_columns(self.path, "data.path", header, body, self.features)
        labels = [row[header.index(target)].strip() for row in body]
        try:  # integer labels sort numerically (2 before 10), names alphabetically
            keys = [str(k) for k in map(int, labels)]
            names = [str(k) for k in sorted({int(k) for k in keys})]
        except ValueError:
            keys, names = labels, sorted(set(labels))
        if len(names) < 2:
            raise ConfigError(f"data.target={target!r}: the column holds {len(names)} class(es), at least 2 needed.")
        position = {name: i for i, name in enumerate(names)}
        self.labels = torch.tensor([position[k] for k in keys])
        self.class_names = names
        self.input_shape = (len(self.features),)

    def load_dataset(self) -> Dataset:
        return TensorDataset(self.inputs, self.labels)

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

"""Your table, by config alone: a CSV, TSV, Parquet or JSON Lines file with named columns: the features and the
target column(s).

``target_type: class`` (classification): one target column of class names (``benign``/``malignant``) or integers;
the sorted distinct values are the classes, and their names are kept (``model.json``, the prediction CSV). A
column of real numbers is refused (it is a regression target: configs/tasks/regression.yaml).
``target_type: value`` (regression): one or several numeric target columns, kept as float32 values.

Features may be numbers or categories. A column of strings (or one listed in ``categorical``, such as integer
codes) is one-hot encoded over the categories of the training split: one input per category, so any net that
takes a vector of numbers takes it, and ``model.json`` names each input (``plan=pro``). One-hot rather than an
embedding per column because the tables this is for have columns of a few to tens of categories, where one-hot
is exact and needs no net of its own; a column of more than ``max_categories`` categories (an ID, free text) is
refused. A category the training split never saw (at predict time) gets all zeros, and the count is printed.

Missing values (an empty cell, NA, NaN, null): with ``missing: impute`` (the default, as in every tabular
library: real tables have holes, and refusing them sends you to write the imputation yourself) a number is
replaced by its column's median over the training split and a ``<column>_missing`` input (0/1) is added for each
column with holes in the training split; a category column gets a ``<missing>`` category. ``missing: refuse``
names the first missing cell instead. A missing target is always refused. The categories, medians and columns
travel in the checkpoint: predict needs none of the training file.

Read with pyarrow: a columnar reader in C++ parses a CSV tens of times faster than Python's csv module, reads
Parquet with its column types, and needs no pandas.
"""

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, TensorDataset

from project.engine import ConfigError, DataModule

SUFFIXES = (".csv", ".tsv", ".parquet", ".jsonl")
MISSING = "<missing>"
ROWS_PER_BLOCK = 8192  # encode's unit of work: 8192 rows of a few hundred inputs fit a core's cache


def read_table(path: Path, key: str, as_text: Callable[[list[str]], list[str]] | None = None) -> Any:
    """The file as a ``pyarrow.Table`` (column names stripped); a ``ConfigError`` naming ``key`` otherwise.
    ``as_text(header)`` names the columns a CSV keeps as written (an ID such as ``00123`` is no number)."""
    try:
        import pyarrow as pa
        import pyarrow.csv as pa_csv
    except ImportError:
        raise ConfigError(
            f"{key}: reading a table needs pyarrow (the 'tables' extra): pip install -e '.[tables]'"
        ) from None
    if not path.is_file():
        raise ConfigError(f"{key}={str(path)!r}: no such file.")
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ConfigError(f"{key}={str(path)!r}: expected a table file ({', '.join(SUFFIXES)}).")
    try:
        if suffix in (".csv", ".tsv"):
            table = _read_delimited(pa, pa_csv, path, key, "\t" if suffix == ".tsv" else ",", as_text)
        elif suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        else:
            import pyarrow.json as pa_json

            table = pa_json.read_json(path)
    except (pa.ArrowInvalid, OSError) as err:
        why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"{key}={str(path)!r} is not a readable {suffix} table ({why}).") from None
    if table.num_rows == 0:
        raise ConfigError(f"{key}={str(path)!r}: expected a header row and at least one data row.")
    return table.rename_columns([name.strip() for name in table.column_names])


def _read_delimited(pa: Any, pa_csv: Any, path: Path, key: str, delimiter: str, as_text: Any) -> Any:
    ragged: list[Any] = []
    text: dict[str, Any] = {}
    if as_text is not None:
        header = pa_csv.open_csv(path, parse_options=pa_csv.ParseOptions(delimiter=delimiter)).schema.names
        wanted = set(as_text([name.strip() for name in header]))
        text = {name: pa.string() for name in header if name.strip() in wanted}

    def remember(row: Any) -> str:
        ragged.append(row)
        return "skip"

    def read(threads: bool) -> Any:
        options = pa_csv.ParseOptions(delimiter=delimiter, invalid_row_handler=remember)
        # Strings as dictionaries (up to pyarrow's 50 distinct values a column, then as strings): the categories are
        # hashed in the parser's threads, and no string column is materialised.
        convert = pa_csv.ConvertOptions(strings_can_be_null=True, column_types=text, auto_dict_encode=True)
        return pa_csv.read_csv(
            path, read_options=pa_csv.ReadOptions(use_threads=threads), parse_options=options, convert_options=convert
        )

    table = read(threads=True)
    if ragged:  # read again in one thread, which numbers the rows, to name the first bad one
        ragged.clear()
        read(threads=False)
        row = ragged[0]
        raise ConfigError(
            f"{key}={str(path)!r}: row {row.number} has {row.actual_columns} values, the header {row.expected_columns}."
        )
    return table


def _cells(table: Any, column: str) -> list[Any]:
    return table.column(column).to_pylist()


def _is_number(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _numbers(table: Any, column: str, path: Path, key: str, missing_ok: bool) -> np.ndarray:
    """The column as float64, NaN where a value is missing; a ``ConfigError`` naming the column and row of a value
    that is not a number (or of a missing one, unless ``missing_ok``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    array = table.column(column)
    if pa.types.is_dictionary(array.type):  # strings read as categories (read_table)
        array = array.cast(array.type.value_type)
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        try:
            array = pc.cast(array, pa.float64())
        except pa.ArrowInvalid:
            row, value = next((r, v) for r, v in enumerate(_cells(table, column), 2) if v and not _is_number(v))
            raise ConfigError(
                f"{key}={str(path)!r}: column {column!r}, row {row}: {value!r} is not a number (the column is "
                "numeric in the training data; list it in data.categorical if it holds categories)."
            ) from None
    elif not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type) or pa.types.is_null(array.type)):
        raise ConfigError(f"{key}={str(path)!r}: column {column!r} holds {array.type} values, not numbers.")
    values = np.asarray(pc.cast(array, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    bad = None if missing_ok else ~np.isfinite(values)
    if bad is not None and bad.any():
        row = int(np.argmax(bad))
        raise ConfigError(
            f"{key}={str(path)!r}: column {column!r}, row {row + 2} is missing or not finite; with data.missing=refuse "
            "fill or drop such rows first (data.missing=impute fills them from the training split)."
        )
    return values


class Categories:
    """A column as categories: its distinct cells (stripped strings; None for a missing or empty cell) and, per row,
    the index of its cell among them. Built from pyarrow's dictionary encoding: one hashing pass over the rows, and
    every other step (trimming, the training split's categories, the codes) works on the few distinct values."""

    def __init__(self, table: Any, column: str) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        array = table.column(column).combine_chunks()
        encoded = array if pa.types.is_dictionary(array.type) else pc.dictionary_encode(array)
        cells = pc.utf8_trim_whitespace(pc.cast(encoded.dictionary, pa.string())).to_pylist()
        cleaned = [v or None for v in cells]
        self.values = sorted(set(cleaned), key=lambda v: (v is None, v or ""))  # distinct after trimming
        position = {v: i for i, v in enumerate(self.values)}
        if encoded.null_count and None not in position:
            position[None] = len(self.values)
            self.values.append(None)
        lut = np.array([position[v] for v in cleaned] + [position.get(None, 0)], np.int64)
        indices = encoded.indices.fill_null(len(cleaned))  # a null cell: the lut's last entry, None
        self.rows = lut[np.asarray(indices.to_numpy(zero_copy_only=False), dtype=np.int64)]

    def first_missing(self) -> int | None:
        """The file row (the header is row 1) of the first missing cell, if any."""
        if None not in self.values:
            return None
        return int(np.argmax(self.rows == self.values.index(None))) + 2

    def counts(self) -> list[int]:
        return np.bincount(self.rows, minlength=len(self.values)).tolist()

    def names(self, rows: np.ndarray | None = None) -> list[str]:
        """The sorted categories of these rows (all by default), a missing cell as ``MISSING``."""
        present = self.values if rows is None else [self.values[i] for i in np.unique(self.rows[rows])]
        return sorted(MISSING if v is None else v for v in present)

    def codes(self, categories: list[str]) -> np.ndarray:
        """Each row's index in ``categories`` (a missing cell is ``MISSING``'s), -1 for a category not in them."""
        position = {v: i for i, v in enumerate(categories)}
        lut = np.array([position.get(MISSING if v is None else v, -1) for v in self.values], np.int64)
        return lut[self.rows]


class Columns:
    """A table's feature columns as the encoding reads them, each converted once: learning the encoding and encoding
    the rows share them."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self._read: dict[tuple[str, str], Any] = {}  # each key written by one column's thread

    def categories(self, column: str, keep: bool = True) -> Categories:
        """The column's ``Categories``; ``keep=False``: its last use (the memory goes with it)."""
        found = self._read.pop(("categories", column), None) or Categories(self.table, column)
        if keep:
            self._read["categories", column] = found
        return found

    def numbers(self, column: str, path: Path, key: str, missing_ok: bool, keep: bool = True) -> np.ndarray:
        """The column's numbers (``_numbers``: float64, NaN where missing); ``keep`` keeps them as float32 (the
        inputs' type, half the memory) for the next call, which has them; ``keep=False``: its last use."""
        found = self._read.pop(("numbers", column), None)
        if found is None:
            found = _numbers(self.table, column, path, key, missing_ok)
        if keep:
            self._read["numbers", column] = found.astype(np.float32)
        return found


def _per_column(function: Callable[[Any], Any], columns: list[Any]) -> list[Any]:
    """``function`` of each column, in order, in threads: numpy, pyarrow and torch release the GIL for their work
    on whole columns, so the columns are read and encoded on every core (the first error, in column order)."""
    with ThreadPoolExecutor(max_workers=min(len(columns), os.cpu_count() or 1) or 1) as pool:
        return list(pool.map(function, columns))


def fit_encoding(
    columns: Columns,
    features: list[str],
    train: list[int],
    categorical: list[str],
    missing: str,
    max_categories: int,
    path: Path,
) -> dict[str, Any]:
    """How each feature becomes inputs, learned from the training rows only: plain data (the checkpoint keeps it)."""
    import pyarrow as pa

    table, rows = columns.table, np.asarray(train, dtype=np.int64)

    def fit(column: str) -> dict[str, Any]:
        kind = table.column(column).type
        strings = pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_dictionary(kind)
        if column in categorical or strings:
            cells = columns.categories(column)  # a missing cell under data.missing=refuse: refused by encode
            if column not in categorical:  # mostly numbers, with stray strings: refused, naming the first
                counted = [(v, n) for v, n in zip(cells.values, cells.counts(), strict=True) if v is not None]
                if counted and sum(n for v, n in counted if _is_number(v)) >= sum(n for _, n in counted) / 2:
                    _numbers(table, column, path, "data.path", missing_ok=True)
            seen = cells.names(rows)
            if len(seen) > max_categories:
                raise ConfigError(
                    f"data.path={str(path)!r}: column {column!r} holds {len(seen)} categories in the training split, "
                    f"more than data.max_categories={max_categories}: an ID or free text is no feature; leave it "
                    f"out (data.exclude=[{column}], or list data.features), or raise data.max_categories."
                )
            if len(seen) < 2 and len(train) > 1:
                raise ConfigError(
                    f"data.path={str(path)!r}: column {column!r} holds one category ({seen}) in the training split: it "
                    "tells the model nothing; leave it out of data.features."
                )
            return {"name": column, "categories": seen}
        numbers = columns.numbers(column, path, "data.path", missing_ok=missing == "impute")[rows]
        holes = bool(np.isnan(numbers).any())
        if holes and np.isnan(numbers).all():
            raise ConfigError(f"data.path={str(path)!r}: column {column!r} is missing in every training row.")
        fill = float(np.nanmedian(numbers)) if holes else float(np.median(numbers)) if len(numbers) else 0.0
        return {"name": column, "fill": fill, "indicator": holes}

    return {"columns": _per_column(fit, features)}


def input_names(encoding: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for c in encoding["columns"]:
        if "categories" in c:
            names += [f"{c['name']}={v}" for v in c["categories"]]
        else:
            names += [c["name"], *([f"{c['name']}_missing"] if c["indicator"] else [])]
    return names


def encode(columns: Columns, encoding: dict[str, Any], path: Path, key: str, missing: str) -> tuple[Tensor, int, dict]:
    """The inputs (rows, len(input_names)) as float32, the number of rows holding a category never seen in
    training (encoded as all zeros), and those categories per column."""
    table = columns.table
    absent = [c["name"] for c in encoding["columns"] if c["name"] not in table.column_names]
    if absent:
        raise ConfigError(f"{key}={str(path)!r} lacks the feature column {absent[0]!r}.")
    widths = [len(c["categories"]) if "categories" in c else 1 + c["indicator"] for c in encoding["columns"]]

    def encode_column(c: dict[str, Any]) -> tuple[list[Tensor], np.ndarray | None, list[str]]:
        """The column's sources: its category codes (-1: a category training never saw), or its values (holes
        filled) and holes; its rows and values of a category training never saw."""
        if "categories" in c:
            cells = columns.categories(c["name"], keep=False)
            if missing == "refuse" and cells.first_missing() is not None:
                raise ConfigError(
                    f"{key}={str(path)!r}: column {c['name']!r}, row {cells.first_missing()} is "
                    "missing (data.missing=refuse)."
                )
            codes = cells.codes(c["categories"])
            unknown = codes < 0
            unseen = sorted({cells.values[i] for i in np.unique(cells.rows[unknown])} - {None})
            return [torch.from_numpy(codes)], unknown, unseen
        values = torch.from_numpy(columns.numbers(c["name"], path, key, missing_ok=missing == "impute", keep=False))
        holes = values.isnan()
        filled = values.to(torch.float32).masked_fill_(holes, c["fill"])
        return [filled, *([holes] if c["indicator"] else [])], None, []

    encoded = _per_column(encode_column, encoding["columns"])
    # Written in sample-major order (the loader reads a sample's values from one place) a block of rows at a time,
    # the blocks in threads: a block's rows stay in the cache while every column writes into them (torch.stack of
    # whole columns, or a transposing copy, reads and writes across the whole table per column: 0.4 s here).
    inputs = torch.empty((table.num_rows, sum(widths)), dtype=torch.float32)
    starts = np.cumsum([0, *widths]).tolist()

    def write_rows(first: int) -> None:
        rows = slice(first, first + ROWS_PER_BLOCK)
        for c, (sources, _, _), start, width in zip(encoding["columns"], encoded, starts[:-1], widths, strict=True):
            if "categories" in c:  # one-hot: input start + code is 1
                torch.eq(sources[0][rows, None], torch.arange(width), out=inputs[rows, start : start + width])
            else:
                for offset, source in enumerate(sources):
                    inputs[rows, start + offset] = source[rows]

    _per_column(write_rows, list(range(0, table.num_rows, ROWS_PER_BLOCK)))
    unknown = np.zeros(table.num_rows, dtype=bool)
    for _, rows, _ in encoded:
        if rows is not None:
            unknown |= rows
    unseen = {c["name"]: values for c, (_, _, values) in zip(encoding["columns"], encoded, strict=True) if values}
    return inputs, int(unknown.sum()), unseen


class CSVDataModule(DataModule):
    """Rows of a table file, split train/val/test by ``split_seed``."""

    learned = (*DataModule.learned, "encoding")  # the raw columns are the encoding's

    def __init__(
        self,
        path: str,
        target: str | list[str],
        features: list[str] | None = None,
        exclude: list[str] | None = None,
        target_type: Literal["class", "value"] = "class",
        categorical: list[str] | None = None,
        missing: Literal["impute", "refuse"] = "impute",
        max_categories: int = 50,
        id_columns: list[str] | None = None,
        **engine: Any,
    ) -> None:
        """
        Args:
            path: the table: .csv (header row first), .tsv, .parquet or .jsonl (one JSON object per row).
            target: the column holding each row's class (``target_type: class``), or the column(s) of real values
                to predict (``target_type: value``).
            features: the input columns, in this order; None = every column but the target(s) and ``exclude``.
            exclude: columns that are no input (an ID, a date, a leak of the target), when ``features`` is None.
            target_type: ``class`` for a classification target, ``value`` for real-valued (regression) targets.
            categorical: columns of categories written as numbers (codes); columns of strings are categories anyway.
            missing: ``impute`` (training-split medians and a missing indicator, or a ``<missing>`` category) or
                ``refuse`` (a missing feature value is an error naming its row).
            max_categories: the most categories a column may hold (more: an ID or free text, refused).
            id_columns: columns that are no input but are carried into the prediction file (as written), so its
                rows join back to yours (a customer ID), a file's and the test split's alike; None = every column of
                the predicted file that is no feature (the target too, when it is there), and none for the test split.
            **engine: the loader, split and normalisation settings of ``DataModule``.
        """
        super().__init__(**engine)
        self.path = Path(path)
        self.id_columns = None if id_columns is None else list(id_columns)
        if self.restored():  # the columns, their encoding and the class names from the checkpoint: no file is read
            return
        ids = list(self.id_columns or [])
        table = read_table(self.path, "data.path", as_text=(lambda header: ids) if ids else None)  # 00123 stays so
        header = table.column_names
        targets = [target] if isinstance(target, str) else list(target)
        unknown_targets = [t for t in targets if t not in header]
        if unknown_targets or not targets:
            raise ConfigError(f"data.target={target!r}: not column(s) of {path!r}; its columns are {header}.")
        if target_type == "class" and len(targets) != 1:
            raise ConfigError(f"data.target={target!r}: classification takes one target column (target_type: class).")
        left_out = [*targets, *(exclude or []), *(id_columns or [])]
        for name, named in ("exclude", exclude), ("id_columns", id_columns):
            if any(c not in header for c in named or []):
                raise ConfigError(f"data.{name}={named!r}: not all are columns of {path!r}; its columns are {header}.")
        self.features = list(features) if features is not None else [c for c in header if c not in left_out]
        unknown = [c for c in self.features if c not in header or c in targets]
        if unknown or not self.features:
            raise ConfigError(
                f"data.features: {unknown or 'none'} cannot be the inputs; choose among {header} except the target."
            )
        unknown = [c for c in categorical or [] if c not in self.features]
        if unknown:
            raise ConfigError(f"data.categorical: {unknown} are not among the features {self.features}.")
        train, _, test = self.split_indices(table.num_rows)
        rows = {c: ["" if v is None else str(v) for v in _cells(table, c)] for c in ids}
        self.test_columns = {c: [values[i] for i in test] for c, values in rows.items()}
        columns = Columns(table)
        self.encoding = fit_encoding(
            columns, self.features, train, list(categorical or []), missing, max_categories, self.path
        )
        self.inputs, _, _ = encode(columns, self.encoding, self.path, "data.path", missing)
        self.input_names = input_names(self.encoding)
        self.input_shape = (len(self.input_names),)
        if target_type == "value":
            self.target_kind = "values"
            self.target_names = targets
            values = [_numbers(table, t, self.path, "data.path", missing_ok=False) for t in targets]
            self.targets = torch.from_numpy(np.stack(values, axis=1).astype(np.float32))
        else:
            labels = Categories(table, targets[0])
            if labels.first_missing() is not None:
                row = labels.first_missing()
                raise ConfigError(f"data.path={path!r}: column {targets[0]!r}, row {row}: the target is missing.")
            self.target_names, self.targets = class_labels(path, targets[0], labels)

    def load_dataset(self) -> Dataset:
        return TensorDataset(self.inputs, self.targets)

    def load_predict_inputs(self, path: Path) -> Tensor:
        if path.suffix == ".npy":
            return super().load_predict_inputs(path)
        features = {column["name"] for column in self.encoding["columns"]}

        def carried(header: list[str]) -> list[str]:
            return [c for c in header if c not in features] if self.id_columns is None else self.id_columns

        table = read_table(path, "data.predict_path", as_text=carried)
        absent = [c for c in carried(table.column_names) if c not in table.column_names]
        if absent:
            raise ConfigError(
                f"data.id_columns={self.id_columns!r}: {absent} are not columns of {str(path)!r}; "
                f"its columns are {table.column_names}."
            )
        inputs, unknown, unseen = encode(
            Columns(table), self.encoding, path, "data.predict_path", self.hparams["missing"]
        )
        self.predict_columns = {
            c: ["" if v is None else str(v) for v in _cells(table, c)] for c in carried(table.column_names)
        }
        if unknown:
            shown = "; ".join(f"{column}: {', '.join(map(repr, values[:5]))}" for column, values in unseen.items())
            print(
                f"{unknown} of the {len(inputs)} rows of {path} hold a category the training data never had "
                f"({shown}), encoded as none of the known ones."
            )
        return inputs

    def show(self, sample: Tensor, ax: Any) -> None:
        names = self.input_names or []
        ax.barh(range(len(names)), sample.numpy())
        ax.set_yticks(range(len(names)), names, fontsize=6)
        ax.invert_yaxis()


def class_labels(path: str, target: str, labels: Categories) -> tuple[list[str], Tensor]:
    """(class names, int64 class indices) of a target column (none missing); a ``ConfigError`` if it holds real
    numbers."""
    values = [str(v) for v in labels.values]
    try:  # integer labels sort numerically (2 before 10), names alphabetically
        keys = [str(k) for k in map(int, values)]
        names, integers = [str(k) for k in sorted({int(k) for k in keys})], True
    except ValueError:
        keys, names, integers = values, sorted(values), False
        real = _real_number(values)
        if real is not None:
            raise ConfigError(
                f"data.target={target!r} in {path!r} holds real numbers (e.g. {real}), not class labels: to predict "
                "a value, train a regressor: --config configs/tasks/regression.yaml (data.target_type: value)."
            ) from None
    if len(names) < 2:
        raise ConfigError(f"data.target={target!r}: the column holds {len(names)} class(es), at least 2 needed.")
    if integers and len(names) > max(20, len(labels.rows) // 5):
        raise ConfigError(
            f"data.target={target!r} in {path!r} holds {len(names)} distinct integers in {len(labels.rows)} rows "
            "(fewer than 5 rows per class): a value to predict rather than classes. Train a regressor: --config "
            "configs/tasks/regression.yaml (data.target_type: value); if they really are classes, write them as names."
        )
    position = {name: i for i, name in enumerate(names)}
    lut = np.array([position[k] for k in keys], np.int64)  # per distinct cell: its class
    return names, torch.from_numpy(lut[labels.rows])


def _real_number(labels: list[str]) -> str | None:
    """A value that shows the labels are real numbers rather than names: all parse as numbers, one is not whole."""
    try:
        numbers = [float(v) for v in labels]
    except ValueError:
        return None
    return next((v for v, x in zip(labels, numbers, strict=True) if not x.is_integer()), None)

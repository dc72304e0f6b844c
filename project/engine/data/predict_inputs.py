"""What ``predict`` reads (``data.predict_path``): the DataModule's ``load_predict_inputs`` decodes your files exactly
as training decodes its samples, and ``check_inputs`` refuses what does not fit the model in one sentence."""

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from project.engine.data import batches
from project.engine.errors import ConfigError


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

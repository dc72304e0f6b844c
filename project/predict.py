"""Using a trained model: reading your own inputs for ``predict``, and writing its predictions to a CSV file.

Inputs are 8x8 digits scaled like the training data: float32 in [0, 1], 0 = background, 1 = full ink.
- ``.npy``: an array of N x 64, N x 8 x 8 or N x 1 x 8 x 8 values in [0, 1];
- ``.csv``: one image per row, 64 comma-separated values in [0, 1] (no header);
- a folder of images (.png/.jpg/.jpeg/.bmp/.gif): each converted to grayscale, resized to 8x8 and inverted, so a
  dark digit on a light background becomes ink on background, as in the training data.
"""

import csv
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from torch import Tensor

from project.errors import ConfigError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif"}
SHAPE = (1, 8, 8)


def load_inputs(path: str | Path) -> Tensor:
    """The images in ``path`` as a float32 tensor shaped (N, 1, 8, 8); ``ConfigError`` naming the file otherwise."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ConfigError(f"data.predict_path={str(path)!r}: the folder holds no {sorted(IMAGE_SUFFIXES)} images.")
        return torch.stack([_load_image(f) for f in files])
    if not path.is_file():
        raise ConfigError(f"data.predict_path={str(path)!r}: no such file or folder.")
    try:
        if path.suffix == ".npy":
            values = np.load(path, allow_pickle=False)
        elif path.suffix == ".csv":
            values = np.loadtxt(path, delimiter=",", dtype=np.float32, ndmin=2)
        else:
            raise ConfigError(
                f"data.predict_path={str(path)!r}: expected a .npy file, a .csv file or a folder of images."
            )
    except ValueError as err:
        raise ConfigError(f"data.predict_path={str(path)!r} could not be read as numbers: {err}") from None
    if values.ndim < 2 or len(values) == 0 or values.shape[1:] not in ((64,), (8, 8), SHAPE):
        raise ConfigError(
            f"data.predict_path={str(path)!r} holds an array shaped {values.shape}; expected N >= 1 rows of 64 "
            "values (N x 64, N x 8 x 8 or N x 1 x 8 x 8)."
        )
    images = torch.as_tensor(values, dtype=torch.float32).reshape(-1, *SHAPE)
    if not torch.isfinite(images).all() or images.min() < 0 or images.max() > 1:
        raise ConfigError(
            f"data.predict_path={str(path)!r}: values must be finite and in [0, 1] (0 = background, 1 = full "
            f"ink), found [{images.min():.3g}, {images.max():.3g}]."
        )
    return images


def _load_image(path: Path) -> Tensor:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            small = image.convert("L").resize(SHAPE[1:], Image.Resampling.BOX)
    except (UnidentifiedImageError, OSError) as err:
        raise ConfigError(f"data.predict_path: {str(path)!r} is not a readable image ({err}).") from None
    return 1.0 - torch.tensor(np.asarray(small), dtype=torch.float32).unsqueeze(0) / 255.0


class CSVPredictionWriter(BasePredictionWriter):
    """Writes ``index, predicted, prob_0, ..., prob_<C-1>`` per input, in input order (one process)."""

    def __init__(self, output: str = "predictions.csv") -> None:
        super().__init__(write_interval="epoch")
        self.output = output

    def write_on_epoch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, predictions: Any, batch_indices: Any
    ) -> None:
        probabilities = torch.cat(list(predictions)).float()
        output = Path(self.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        with open(output, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["index", "predicted", *(f"prob_{c}" for c in range(probabilities.shape[1]))])
            for index, row in enumerate(probabilities.tolist()):
                writer.writerow([index, int(np.argmax(row)), *(f"{p:.6g}" for p in row)])
        print(f"Wrote {len(probabilities)} predictions to {output}")

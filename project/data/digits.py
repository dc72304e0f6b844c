"""The offline default: scikit-learn's bundled handwritten digits, 1,797 grayscale 8x8 images of 0-9.

Inputs are float32 images shaped (1, 8, 8) in [0, 1], 0 = background, 1 = full ink. ``predict`` reads:
- ``.npy``: an array of N x 64, N x 8 x 8 or N x 1 x 8 x 8 values in [0, 1];
- ``.csv``: one image per row, 64 comma-separated values in [0, 1] (no header);
- a folder of images (.png/.jpg/.jpeg/.bmp/.gif): each converted to grayscale, resized to 8x8 and inverted, so a
  dark digit on a light background becomes ink on background, as in the training data.
"""

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, TensorDataset

from project.engine import ConfigError, DataModule

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif"}


class DigitsDataModule(DataModule):
    """Scikit-learn's digits (nothing is downloaded), split 70/15/15 by ``split_seed``. Not normalised by default:
    the pixels are already in [0, 1]."""

    def __init__(self, *, normalize: bool = False, **engine: Any) -> None:
        """
        Args:
            normalize: standardise the pixels with the training split's mean/std.
            **engine: the loader and split settings of ``DataModule`` (batch_size, num_workers, ...).
        """
        super().__init__(normalize=normalize, **engine)
        self.target_names = [str(digit) for digit in range(10)]
        self.input_shape = (1, 8, 8)

    def load_dataset(self) -> Dataset:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        return TensorDataset(images, torch.tensor(digits.target, dtype=torch.int64))

    def load_predict_inputs(self, path: Path) -> Tensor:
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise ConfigError(
                    f"data.predict_path={str(path)!r}: the folder holds no {sorted(IMAGE_SUFFIXES)} images."
                )
            return torch.stack([_load_image(f) for f in files])
        if path.suffix not in (".npy", ".csv"):
            raise ConfigError(
                f"data.predict_path={str(path)!r}: expected a .npy file, a .csv file or a folder of images."
            )
        try:
            if path.suffix == ".npy":
                values = np.load(path, allow_pickle=False)
            else:
                values = np.loadtxt(path, delimiter=",", dtype=np.float32, ndmin=2)
        except ValueError as err:
            raise ConfigError(f"data.predict_path={str(path)!r} could not be read as numbers: {err}") from None
        if values.ndim == 3:  # N x 8 x 8
            values = values.reshape(len(values), -1)
        images = self.check_predict_inputs(path, values)
        if images.min() < 0 or images.max() > 1:
            raise ConfigError(
                f"data.predict_path={str(path)!r}: values must be finite and in [0, 1] (0 = background, 1 = full "
                f"ink), found [{images.min():.3g}, {images.max():.3g}]."
            )
        return images

    def show(self, sample: Tensor, ax: Any) -> None:
        ax.imshow(sample[0].numpy(), cmap="gray_r", vmin=0, vmax=1)  # ink is dark, as on paper
        ax.set_axis_off()


def _load_image(path: Path) -> Tensor:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            small = image.convert("L").resize((8, 8), Image.Resampling.BOX)
    except (UnidentifiedImageError, OSError) as err:
        raise ConfigError(f"data.predict_path: {str(path)!r} is not a readable image ({err}).") from None
    return 1.0 - torch.tensor(np.asarray(small), dtype=torch.float32).unsqueeze(0) / 255.0

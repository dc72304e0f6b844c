"""Your images, by config alone: a folder with one subfolder per class (``root/cat/001.png``, ``root/dog/7.jpg``).

Class names are the subfolder names, in sorted order. Every image is decoded (by the DataLoader's workers when
``num_workers`` > 0), converted to RGB or grayscale, resized to ``image_size`` and scaled to [0, 1]; the
normalisation (per channel, from the training split) is applied on the device. Decoding uses Pillow, already a
dependency; torchvision is not needed for a resize and a flip.
``predict`` reads one image file or a folder of them (sorted by name), decoded the same way.
"""

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset

from project.engine import ConfigError, DataModule

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def decode_image(path: Path, size: tuple[int, int], grayscale: bool) -> Tensor:
    """One image file as float32 (C, H, W) in [0, 1]; a ``ConfigError`` naming the file if it cannot be read."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image = image.convert("L" if grayscale else "RGB").resize((size[1], size[0]), Image.Resampling.BILINEAR)
            pixels = np.asarray(image, dtype=np.float32) / 255.0
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise ConfigError(f"{str(path)!r} is not a readable image ({err}).") from None
    return torch.from_numpy(pixels[None] if grayscale else pixels.transpose(2, 0, 1).copy())


def images_to_predict(path: Path, input_shape: tuple[int, ...]) -> tuple[list[Path], list[str]]:
    """The image files ``predict`` reads at ``path`` (one image, or a folder's, sorted) and their names (relative
    to the folder); a ``ConfigError`` naming ``path`` when it holds none."""
    files = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES) if path.is_dir() else [path]
    if not files or files[0].suffix.lower() not in IMAGE_SUFFIXES:
        raise ConfigError(
            f"data.predict_path={str(path)!r}: expected an image file, a folder of images {IMAGE_SUFFIXES} or "
            f"a .npy array of N x {input_shape}."
        )
    return files, [str(f.relative_to(path)) if path.is_dir() else f.name for f in files]


class ImageFiles(Dataset[tuple[Tensor, Tensor]]):
    """(image, label) pairs decoded from files on each access."""

    def __init__(self, files: list[tuple[Path, int]], size: tuple[int, int], grayscale: bool) -> None:
        self.files, self.size, self.grayscale = files, size, grayscale

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        path, label = self.files[index]
        return decode_image(path, self.size, self.grayscale), torch.tensor(label)


class Flipped(Dataset[tuple[Tensor, Tensor]]):
    """The training split with random horizontal flips of its images (and of its targets too, where they are
    images themselves: a segmentation's masks); val/test/predict see the images as they are."""

    def __init__(self, subset: Subset, targets_too: bool = False) -> None:
        self.subset, self.targets_too = subset, targets_too

    def __len__(self) -> int:
        return len(self.subset)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image, target = self.subset[index]
        # torch's RNG: in a worker, seeded per epoch from the loader's generator; without workers, the run's
        # (checkpointed) RNG, so a mid-epoch resume with num_workers=0 replays the same flips.
        if torch.rand(()) >= 0.5:
            return image, target
        return image.flip(-1), target.flip(-1) if self.targets_too else target


class ImageFolderDataModule(DataModule):
    """Images in class subfolders of ``root``, split train/val/test by ``split_seed``."""

    def __init__(
        self,
        root: str,
        image_size: int | tuple[int, int] = 32,
        grayscale: bool = False,
        augment: bool = False,
        **engine: Any,
    ) -> None:
        """
        Args:
            root: the folder whose subfolders are the classes.
            image_size: every image is resized to this (height, width), or a square of this side.
            grayscale: one channel instead of RGB.
            augment: random horizontal flips of training images (not of val/test/predict images).
            **engine: the loader, split and normalisation settings of ``DataModule``.
        """
        super().__init__(**engine)
        self.size: tuple[int, int] = (image_size, image_size) if isinstance(image_size, int) else image_size
        if min(self.size) < 1:
            raise ConfigError(f"data.image_size={image_size!r}: must be >= 1 pixel.")
        if self.restored():  # the class names from the checkpoint: the folder is not read
            return
        folder = Path(root)
        if not folder.is_dir():
            raise ConfigError(f"data.root={root!r}: no such folder (expected one subfolder per class).")
        classes = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        self.files: list[tuple[Path, int]] = []
        for label, directory in enumerate(classes):
            images = sorted(p for p in directory.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
            if not images:
                raise ConfigError(f"data.root={root!r}: the class folder {directory.name!r} holds no images.")
            self.files += [(p, label) for p in images]
        if len(classes) < 2:
            raise ConfigError(
                f"data.root={root!r}: found {len(classes)} class subfolder(s) with images; classification needs "
                f"at least 2 (one subfolder per class, e.g. {root}/cat/*.png and {root}/dog/*.png)."
            )
        self.target_names = [p.name for p in classes]
        self.input_shape = (1 if grayscale else 3, *self.size)

    def load_dataset(self) -> Dataset:
        return ImageFiles(self.files, self.size, self.hparams["grayscale"])

    def load_splits(self) -> tuple[Dataset, Dataset, Dataset]:
        train, val, test = super().load_splits()
        return (Flipped(train) if self.hparams["augment"] else train), val, test  # type: ignore[arg-type]

    def load_predict_inputs(self, path: Path) -> Tensor:
        if path.suffix == ".npy":
            return super().load_predict_inputs(path)
        files, names = images_to_predict(path, self.input_shape)
        self.predict_columns = {"input": names}
        return torch.stack([decode_image(f, self.size, self.hparams["grayscale"]) for f in files])

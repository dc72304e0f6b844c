"""Semantic segmentation data, by config alone: ``root/images/<stem>.png|jpg`` and ``root/masks/<stem>.png``,
where a mask's pixel value is the class index of that pixel (a grayscale or palette PNG of the image's size).

Class names come from ``root/classes.txt`` (one per line, in index order) when it exists, else they are
``0 .. K-1`` with K the largest mask value + 1. Every pair is checked when the DataModule is built (the masks are
read once, each image checked whole by Pillow's verify without being decoded), so a missing partner, a size
mismatch, a value outside the classes or an unreadable file stops the run before anything starts, in one sentence
naming the file. Images are decoded by the
DataModule's workers as ``images.py`` decodes them, resized to ``image_size`` (masks by nearest neighbour, so
they keep their class values); ``augment`` flips training pairs, image and mask together.
``predict`` reads one image or a folder of them and keeps each one's name and original size, so that the masks
predicted for them are written at the size of the input (``project/tasks/segmentation.py``).
"""

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from project.data.images import IMAGE_SUFFIXES, Flipped, decode_image, images_to_predict
from project.engine import ConfigError, DataModule

# Single-channel modes whose pixel values are the values written (a palette PNG's are the palette indices).
MASK_MODES = ("L", "P", "I", "I;16", "1")


def read_mask(path: Path, size: tuple[int, int] | None = None) -> np.ndarray:
    """A mask file as an int64 (H, W) array of class values, resized by nearest neighbour to ``size`` (height,
    width) if given; a ``ConfigError`` naming the file if it is unreadable or not single-channel."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            if image.mode not in MASK_MODES:
                raise ConfigError(
                    f"{str(path)!r} is a {image.mode} image; a mask must be single-channel (grayscale or palette "
                    "PNG) with the class index as each pixel's value."
                )
            if size is not None and image.size != (size[1], size[0]):
                image = image.resize((size[1], size[0]), Image.Resampling.NEAREST)
            return np.asarray(image).astype(np.int64)
    except (UnidentifiedImageError, OSError, ValueError) as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"{str(path)!r} is not a readable mask image ({err}).") from None


def image_size_of(path: Path) -> tuple[int, int]:
    """An image file's (height, width), from its header; a ``ConfigError`` naming the file if it is unreadable."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.verify()  # a truncated or corrupt file fails here rather than in a worker, mid-run
            return image.size[1], image.size[0]
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise ConfigError(f"{str(path)!r} is not a readable image ({err}).") from None


class SegmentationFiles(Dataset[tuple[Tensor, Tensor]]):
    """(image, mask) pairs decoded from files on each access: float32 (C, H, W) in [0, 1], int64 (H, W)."""

    def __init__(self, pairs: list[tuple[Path, Path]], size: tuple[int, int], grayscale: bool) -> None:
        self.pairs, self.size, self.grayscale = pairs, size, grayscale

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image, mask = self.pairs[index]
        return decode_image(image, self.size, self.grayscale), torch.from_numpy(read_mask(mask, self.size))


class SegmentationFolderDataModule(DataModule):
    """Images with one class mask each (``root/images``, ``root/masks``), split train/val/test by ``split_seed``.
    A target is the (H, W) int64 map of class indices at ``image_size``."""

    def __init__(
        self,
        root: str,
        image_size: int | tuple[int, int] = 32,
        grayscale: bool = False,
        augment: bool = False,
        ignore_index: int | None = None,
        **engine: Any,
    ) -> None:
        """
        Args:
            root: the folder holding ``images/``, ``masks/`` and optionally ``classes.txt``.
            image_size: every image and mask is resized to this (height, width), or a square of this side.
            grayscale: one channel instead of RGB.
            augment: random horizontal flips of training pairs (not of val/test/predict images).
            ignore_index: a mask value that marks unlabelled pixels (e.g. 255): allowed in masks, not a class; the
                task must ignore the same value (``model.ignore_index``).
            **engine: the loader, split and normalisation settings of ``DataModule``.
        """
        super().__init__(**engine)
        self.size: tuple[int, int] = (image_size, image_size) if isinstance(image_size, int) else image_size
        if min(self.size) < 1:
            raise ConfigError(f"data.image_size={image_size!r}: must be >= 1 pixel.")
        self.ignore_index = ignore_index  # the task checks that it ignores the same value
        self.predict_sizes: list[tuple[int, int]] | None = None
        if self.restored():  # the class names from the checkpoint: no image or mask is read
            return
        folder = Path(root)
        images_dir, masks_dir = folder / "images", folder / "masks"
        if not images_dir.is_dir() or not masks_dir.is_dir():
            raise ConfigError(
                f"data.root={root!r}: expected the folders {root}/images (the pictures) and {root}/masks (one PNG "
                "of class indices per picture, of the same name)."
            )
        images: dict[str, Path] = {}
        for path in sorted(p for p in images_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES):
            if path.stem in images:  # both would claim the one mask of that name
                raise ConfigError(
                    f"{str(path)!r} and {images[path.stem].name!r} share a name: a mask belongs to one image (rename "
                    "one)."
                )
            images[path.stem] = path
        masks = {p.stem: p for p in sorted(masks_dir.iterdir()) if p.suffix.lower() == ".png"}
        for stem, path in images.items():
            if stem not in masks:
                raise ConfigError(f"{str(path)!r} has no mask: expected {str(masks_dir / (stem + '.png'))!r}.")
        for stem, path in masks.items():
            if stem not in images:
                raise ConfigError(f"{str(path)!r} is a mask without an image: expected {images_dir}/{stem}.<png|jpg>.")
        if not images:
            raise ConfigError(f"data.root={root!r}: {images_dir} holds no images {IMAGE_SUFFIXES}.")
        self.pairs = [(images[stem], masks[stem]) for stem in sorted(images)]
        names_file = folder / "classes.txt"
        names = None
        if names_file.is_file():
            names = [line.strip() for line in names_file.read_text().splitlines() if line.strip()]
        largest = -1
        for image, mask in self.pairs:
            values = read_mask(mask)
            height, width = image_size_of(image)
            if values.shape != (height, width):
                raise ConfigError(
                    f"{str(mask)!r} is {values.shape[1]}x{values.shape[0]} pixels but its image {image.name!r} is "
                    f"{width}x{height}: a mask must have its image's size."
                )
            labelled = values[values != ignore_index] if ignore_index is not None else values
            top = int(labelled.max()) if labelled.size else -1
            if names is not None and top >= len(names):
                unlabelled = f", or {ignore_index} for unlabelled pixels" if ignore_index is not None else ""
                raise ConfigError(
                    f"{str(mask)!r} holds the value {top}, but {names_file} names {len(names)} classes (values 0 to "
                    f"{len(names) - 1}{unlabelled})."
                )
            largest = max(largest, top)
        self.target_names = names if names is not None else [str(k) for k in range(largest + 1)]
        if len(self.target_names) < 2:
            raise ConfigError(
                f"data.root={root!r}: the masks hold {len(self.target_names)} class(es); at least 2 are needed."
            )
        self.input_shape = (1 if grayscale else 3, *self.size)

    def load_dataset(self) -> Dataset:
        return SegmentationFiles(self.pairs, self.size, self.hparams["grayscale"])

    def load_splits(self) -> tuple[Dataset, Dataset, Dataset]:
        train, val, test = super().load_splits()
        flipped = Flipped(train, targets_too=True)  # type: ignore[arg-type]
        return (flipped if self.hparams["augment"] else train), val, test  # type: ignore[arg-type]

    def load_predict_inputs(self, path: Path) -> Tensor:
        if path.suffix == ".npy":
            self.predict_columns, self.predict_sizes = {}, None  # raw arrays: the masks come at image_size
            return super().load_predict_inputs(path)
        files, names = images_to_predict(path, self.input_shape)
        self.predict_columns = {"input": names}
        self.predict_sizes = [image_size_of(f) for f in files]  # each predicted mask is written at this size
        return torch.stack([decode_image(f, self.size, self.hparams["grayscale"]) for f in files])

"""The data rooms: ``base.py`` is the engine every DataModule gets (loaders, samplers, resume, normalisation); the
others each describe one kind of data. Add yours as a new file, subclassing ``ClassificationDataModule``, and
select it with ``data.class_path`` in the config."""

from project.data.base import ClassificationDataModule, UnpaddedDistributedSampler
from project.data.digits import DigitsDataModule
from project.data.images import ImageFolderDataModule
from project.data.table import CSVDataModule

__all__ = [
    "CSVDataModule",
    "ClassificationDataModule",
    "DigitsDataModule",
    "ImageFolderDataModule",
    "UnpaddedDistributedSampler",
]

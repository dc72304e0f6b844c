"""Your data: each file describes one kind of data as a DataModule subclassing
``project.engine.DataModule`` (the engine: split, loaders, samplers, resume, normalisation). Add yours as
a new file and select it with ``data.class_path`` in the config."""

from project.data.chat import ChatDataModule
from project.data.digits import DigitsDataModule
from project.data.images import ImageFolderDataModule
from project.data.labelled_text import LabelledTextDataModule
from project.data.segmentation import SegmentationFolderDataModule
from project.data.table import CSVDataModule
from project.data.text import TextDataModule

__all__ = [
    "CSVDataModule",
    "ChatDataModule",
    "DigitsDataModule",
    "ImageFolderDataModule",
    "LabelledTextDataModule",
    "SegmentationFolderDataModule",
    "TextDataModule",
]

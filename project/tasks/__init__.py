"""Your tasks: each file is one kind of problem as a LightningModule subclassing ``project.engine.Task``, and
says only what the problem is (loss, metrics, the metric it is judged by, what a prediction is). Select one with
``model.class_path`` in the config (configs/tasks/*.yaml)."""

from project.tasks.classification import Classifier
from project.tasks.language_model import LanguageModel
from project.tasks.regression import Regressor
from project.tasks.segmentation import Segmenter

__all__ = ["Classifier", "LanguageModel", "Regressor", "Segmenter"]

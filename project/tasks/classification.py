"""Classification: one class per sample, cross-entropy on logits, judged by accuracy on the validation split."""

from typing import Any

import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from project.engine.errors import ConfigError
from project.engine.task import Task


class Classifier(Task):
    """Cross-entropy over the DataModule's classes; ``val/acc`` (max) picks the best checkpoint. Predictions are
    the class probabilities; the exported model outputs logits."""

    monitor = "val/acc"
    mode = "max"
    target_kind = "classes"

    def __init__(self, label_smoothing: float = 0.0, **engine: Any) -> None:
        """
        Args:
            label_smoothing: cross-entropy label smoothing in [0, 1).
            **engine: the net, optimizer and schedule settings of ``project.engine.task.Task``.
        """
        if not 0.0 <= label_smoothing < 1.0:
            raise ConfigError(f"model.label_smoothing={label_smoothing!r}: must lie in [0, 1).")
        self.label_smoothing = label_smoothing
        super().__init__(**engine)

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(outputs, targets, reduction="none", label_smoothing=self.label_smoothing)

    def configure_metrics(self) -> MetricCollection:
        return MetricCollection({"acc": MulticlassAccuracy(len(self.target_names), average="micro")})

    def prediction(self, outputs: Tensor) -> Tensor:
        return outputs.softmax(dim=-1)

    def prediction_table(self, predictions: Tensor) -> tuple[list[str], list[list[Any]]]:
        names = self.target_names
        header = ["predicted_class", "predicted_index", *(f"prob_{name}" for name in names)]
        best = predictions.argmax(dim=-1).tolist()
        rows = [[names[b], b, *(f"{p:.6g}" for p in row)] for b, row in zip(best, predictions.tolist(), strict=True)]
        return header, rows

    def output_description(self) -> dict[str, Any]:
        return {"name": "logits", "shape": ["batch", len(self.target_names)], "classes": self.target_names,
                "meaning": "unnormalised log-probabilities: softmax gives the class probabilities"}  # fmt: skip

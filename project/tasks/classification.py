"""Classification: one class per sample, cross-entropy on logits, judged by accuracy on the validation split
unless the config names another of its metrics (``model.metrics``, ``model.monitor``).

Accuracy is right when the classes are about as frequent as each other. With a rare class (19% churners), a
model that never predicts it scores 0.81: judge it by ``balanced_acc`` (the mean of the per-class recalls: 0.5
for that model), ``macro_f1`` (precision and recall of every class, each class counting the same), or, to rank
the samples by a probability before choosing a threshold, ``auroc`` or ``average_precision`` (which weighs the
rare class's precision, the harder of the two to score well on)."""

from typing import Any, Literal

import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassAUROC,
    MulticlassAveragePrecision,
    MulticlassF1Score,
)

from project.engine.errors import ConfigError
from project.engine.task import Task


class Classifier(Task):
    """Cross-entropy over the DataModule's classes; ``val/acc`` (max) picks the best checkpoint. Predictions are
    the class probabilities; the exported model outputs logits."""

    monitor = "val/acc"
    mode = "max"
    target_kind = "classes"

    def __init__(
        self,
        label_smoothing: float = 0.0,
        metrics: list[Literal["acc", "balanced_acc", "macro_f1", "auroc", "average_precision"]] | None = None,
        **engine: Any,
    ) -> None:
        """
        Args:
            label_smoothing: cross-entropy label smoothing in [0, 1).
            metrics: what is logged per evaluation (default ``[acc]``); ``model.monitor`` (e.g. ``val/auroc``)
                says which one judges the run. Every one is exact over the whole split (AUROC and average
                precision keep every score of the split: fine for validation sets of up to millions of samples).
            **engine: the net, optimizer and schedule settings of ``project.engine.task.Task``.
        """
        if not 0.0 <= label_smoothing < 1.0:
            raise ConfigError(f"model.label_smoothing={label_smoothing!r}: must lie in [0, 1).")
        self.label_smoothing = label_smoothing
        self.metric_names = list(metrics or ["acc"])
        super().__init__(**engine)

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(outputs, targets, reduction="none", label_smoothing=self.label_smoothing)

    def configure_metrics(self) -> MetricCollection:
        k = len(self.target_names)
        # validate_args=False: the argument checks cost a host sync per update (a wait for the device each step).
        made = {
            "acc": lambda: MulticlassAccuracy(k, average="micro"),
            "balanced_acc": lambda: MulticlassAccuracy(k, average="macro", validate_args=False),
            "macro_f1": lambda: MulticlassF1Score(k, average="macro", validate_args=False),
            "auroc": lambda: MulticlassAUROC(k, average="macro", validate_args=False),
            "average_precision": lambda: MulticlassAveragePrecision(k, average="macro", validate_args=False),
        }
        return MetricCollection({name: made[name]() for name in self.metric_names})

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

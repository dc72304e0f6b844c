"""Classification: one class per sample, cross-entropy on logits, judged by accuracy on the validation split
unless the config names another of its metrics (``model.metrics``, ``model.monitor``).

Accuracy is right when the classes are about as frequent as each other. With a rare class (19% churners), a
model that never predicts it scores 0.81: judge it by ``balanced_acc`` (the mean of the per-class recalls: 0.5
for that model), ``macro_f1`` (precision and recall of every class, each class counting the same), or, to rank
the samples by a probability before choosing a threshold, ``auroc`` or ``average_precision`` (which weighs the
rare class's precision, the harder of the two to score well on). ``class_weights: balanced`` also makes training
count the rare class more: scikit-learn's "balanced" weights from the training split's class counts."""

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassAUROC,
    MulticlassAveragePrecision,
    MulticlassF1Score,
)

from project.engine import ConfigError, Task


class Classifier(Task):
    """Cross-entropy over the DataModule's classes; ``val/acc`` (max) picks the best checkpoint. Predictions are
    the class probabilities; the exported model outputs logits."""

    monitor = "val/acc"
    mode = "max"
    target_kind = "classes"
    class_weights: Tensor | None

    def __init__(
        self,
        label_smoothing: float = 0.0,
        metrics: list[Literal["acc", "balanced_acc", "macro_f1", "auroc", "average_precision"]] | None = None,
        class_weights: Literal["none", "balanced"] = "none",
        **engine: Any,
    ) -> None:
        """
        Args:
            label_smoothing: cross-entropy label smoothing in [0, 1).
            metrics: what is logged per evaluation (default ``[acc]``); ``model.monitor`` (e.g. ``val/auroc``)
                says which one judges the run. Every one is exact over the whole split (AUROC and average
                precision keep every score of the split: fine for validation sets of up to millions of samples).
            class_weights: ``balanced``: each sample's loss weighted by N / (classes x its class's count in the
                training split), so every class weighs the same in total; ``none``: every sample alike. The
                weighted loss is the one logged (val/loss too); the metrics count every sample once.
            **engine: the net, optimizer and schedule settings of ``project.engine.Task``.
        """
        if not 0.0 <= label_smoothing < 1.0:
            raise ConfigError(f"model.label_smoothing={label_smoothing!r}: must lie in [0, 1).")
        if engine.get("target_names") is not None and len(engine["target_names"]) < 2:  # torchmetrics needs 2+
            raise ConfigError(
                f"model.class_path={type(self).__name__} tells classes apart, but the data serves one target, "
                f"{list(engine['target_names'])}: for real values train a regressor (the regression example's "
                "configs/tasks/regression.yaml); a classifier needs two classes or more."
            )
        self.label_smoothing = label_smoothing
        self.metric_names = list(metrics or ["acc"])
        super().__init__(**engine)
        # A buffer, so in the checkpoint: a resumed run weighs as the uninterrupted one.
        weights = torch.ones(len(self.target_names)) if class_weights == "balanced" else None
        self.register_buffer("class_weights", weights)

    def setup(self, stage: str) -> None:
        super().setup(stage)
        datamodule = self.trainer.datamodule  # type: ignore[attr-defined]
        if stage == "fit" and self.class_weights is not None and datamodule is not None:
            # From the training split, on every process alike (the split is fixed by its seed).
            counts = torch.bincount(datamodule.split_targets("train"), minlength=len(self.target_names))
            if not counts.all():
                absent = [name for name, c in zip(self.target_names, counts.tolist(), strict=True) if c == 0]
                raise ConfigError(
                    f"model.class_weights='balanced': the training split has no sample of {absent}, whose weight "
                    "would be infinite; use class_weights: none, or data with every class in its training split."
                )
            self.class_weights.copy_(counts.sum() / (len(counts) * counts.double()))

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        # The per-sample weighted losses, averaged over samples by the engine (not torch's sum(w l) / sum(w) per
        # batch): the mean stays a mean over samples, so accumulation and DDP stay equal to the big batch, and the
        # balanced weights sum to N over the training split, so the loss keeps its scale.
        return F.cross_entropy(
            outputs, targets, weight=self.class_weights, reduction="none", label_smoothing=self.label_smoothing
        )

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
        return {
            "name": "logits",
            "shape": ["batch", len(self.target_names)],
            "classes": self.target_names,
            "meaning": "unnormalised log-probabilities: softmax gives the class probabilities",
        }

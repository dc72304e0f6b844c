"""Multi-label classification, a task in one file: several yes/no tags per sample (e.g. a CSV's 0/1 columns),
one logit per tag, binary cross-entropy, judged by the macro F1 over the tags (configs/tasks/multilabel.yaml)."""

from typing import Any

import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.classification import MultilabelAUROC, MultilabelF1Score

from project.engine import Task


class MultiLabel(Task):
    """Each tag is predicted when its probability exceeds ``threshold``."""

    monitor = "val/f1"
    mode = "max"
    target_kind = "values"  # one 0/1 value per tag

    def __init__(self, threshold: float = 0.5, **engine: Any) -> None:
        """
        Args:
            threshold: the probability above which a tag is predicted.
            **engine: the net, optimizer and schedule settings of ``project.engine.Task``.
        """
        self.threshold = threshold
        super().__init__(**engine)

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(outputs, targets, reduction="none").mean(-1)

    def configure_metrics(self) -> MetricCollection:
        tags = len(self.target_names)
        # No argument checks (validate_args): the DataModule guarantees 0/1 targets; each check is a GPU host sync.
        f1 = MultilabelF1Score(tags, threshold=self.threshold, average="macro", validate_args=False)
        return MetricCollection({"f1": f1, "auroc": MultilabelAUROC(tags, validate_args=False)}, compute_groups=False)

    def update_metrics(self, metrics: MetricCollection, outputs: Tensor, targets: Tensor) -> None:
        metrics.update(outputs.sigmoid(), targets.long())

    def prediction(self, outputs: Tensor) -> Tensor:
        return outputs.sigmoid()

    def prediction_table(self, predictions: Tensor) -> tuple[list[str], list[list[Any]]]:
        names = self.target_names
        header = [*(f"predicted_{name}" for name in names), *(f"prob_{name}" for name in names)]
        rows = [[*(int(p > self.threshold) for p in row), *(f"{p:.6g}" for p in row)] for row in predictions.tolist()]
        return header, rows

    def output_description(self) -> dict[str, Any]:
        meaning = "one logit per tag: its sigmoid is the tag's probability"
        return {
            "name": "logits",
            "shape": ["batch", len(self.target_names)],
            "tags": self.target_names,
            "meaning": meaning,
        }

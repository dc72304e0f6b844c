"""Semantic segmentation: a class for every pixel, per-pixel cross-entropy, judged by the mean IoU over the classes
on the validation split (configs/tasks/segmentation.yaml)."""

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassJaccardIndex

from project.engine import ConfigError, Task

MASKS = "masks"  # the folder, beside the prediction file, that predict writes one mask PNG per input into


def mask_file(index: int) -> str:
    """Where the mask predicted for input ``index`` is written, relative to the prediction file's folder."""
    return f"{MASKS}/{index:05d}.png"


class Segmenter(Task):
    """The net outputs logits shaped (batch, classes, H, W); ``val/miou`` (max) picks the best checkpoint. Predictions
    are per-pixel class probabilities; ``predict`` writes each input's mask of class indices at the input's size."""

    monitor = "val/miou"
    mode = "max"
    target_kind = "classes"  # an int64 class index per pixel

    def __init__(self, ignore_index: int | None = None, **engine: Any) -> None:
        """
        Args:
            ignore_index: a mask value marking unlabelled pixels (e.g. 255), left out of the loss and the metrics;
                it must be the DataModule's ``ignore_index`` too.
            **engine: the net, optimizer and schedule settings of ``project.engine.Task``.
        """
        self.ignore_index = ignore_index
        super().__init__(**engine)

    def setup(self, stage: str) -> None:
        super().setup(stage)
        datamodule = self.trainer.datamodule  # type: ignore[attr-defined]
        theirs = getattr(datamodule, "ignore_index", self.ignore_index)  # checked where the DataModule declares one
        if theirs != self.ignore_index:
            raise ConfigError(
                f"model.ignore_index={self.ignore_index!r} but data.ignore_index={theirs!r}: the value that marks "
                "unlabelled pixels must be the same for both."
            )

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        ignore = -100 if self.ignore_index is None else self.ignore_index
        # Unreduced, then averaged here: the mean-reduced CUDA kernel (nll_loss2d) is not deterministic and raises
        # under trainer.deterministic. Each image's loss is the mean over its labelled pixels.
        pixels = F.cross_entropy(outputs, targets, reduction="none", ignore_index=ignore).flatten(1)
        labelled = (targets != ignore).flatten(1).sum(1)
        return pixels.sum(1) / labelled.clamp_min(1)

    def configure_metrics(self) -> MetricCollection:
        classes = len(self.target_names)
        # Both accumulate counts (a confusion matrix, pixel tallies): exact over the whole split and across ranks.
        # The IoU's macro average leaves out a class absent from both the truth and the predictions.
        miou = MulticlassJaccardIndex(classes, average="macro", ignore_index=self.ignore_index)
        acc = MulticlassAccuracy(classes, average="micro", ignore_index=self.ignore_index)  # over all pixels
        return MetricCollection({"miou": miou, "acc": acc}, compute_groups=False)

    def prediction(self, outputs: Tensor) -> Tensor:
        return outputs.softmax(dim=1)

    def prediction_table(self, predictions: Tensor) -> tuple[list[str], list[list[Any]]]:
        """Per input: its mask file (written by ``write_prediction_files``) and the fraction of its pixels
        predicted as each class (at the model's resolution)."""
        names, (n, classes) = self.target_names, predictions.shape[:2]
        predicted = predictions.argmax(dim=1).flatten(1)
        offsets = torch.arange(n, device=predicted.device)[:, None] * classes
        counts = torch.bincount((predicted + offsets).flatten(), minlength=n * classes).view(n, classes)
        fractions = (counts / predicted.shape[1]).tolist()
        header = ["mask", *(f"fraction_{name}" for name in names)]
        return header, [[mask_file(i), *(f"{f:.6g}" for f in row)] for i, row in enumerate(fractions)]

    def write_prediction_files(self, predictions: Tensor, folder: Path, datamodule: Any) -> None:
        """One PNG per input whose pixel values are the predicted class indices, at the input's own size when the
        DataModule kept it (``predict_sizes``; resized by nearest neighbour), else at the model's."""
        from PIL import Image

        predicting_files = getattr(datamodule, "predict_set", None) is not None
        sizes = getattr(datamodule, "predict_sizes", None) if predicting_files else None
        (folder / MASKS).mkdir(parents=True, exist_ok=True)
        dtype = np.uint8 if len(self.target_names) <= 256 else np.uint16
        for i, mask in enumerate(predictions.argmax(dim=1).cpu().numpy().astype(dtype)):
            image = Image.fromarray(mask)
            if sizes is not None and image.size != (sizes[i][1], sizes[i][0]):
                image = image.resize((sizes[i][1], sizes[i][0]), Image.Resampling.NEAREST)
            image.save(folder / mask_file(i))

    def output_description(self) -> dict[str, Any]:
        return {
            "name": "logits",
            "shape": ["batch", len(self.target_names), "height", "width"],
            "classes": self.target_names,
            "meaning": "unnormalised per-pixel log-probabilities over the classes (dimension 1), height x width "
            "as the input's: softmax over dimension 1 gives each pixel's class probabilities, argmax "
            "its class index",
        }

"""Regression: one or several real values per sample, judged by the RMSE in the targets' own units."""

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection, R2Score

from project.engine import ConfigError, Task


class Standardization(nn.Module):
    """Targets <-> the standardised values the net learns: ``y = z * std + mean`` per target. Its statistics are
    buffers (plain tensors in the checkpoint), set from the training split when a fit starts."""

    mean: Tensor
    std: Tensor

    def __init__(self, targets: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(targets))
        self.register_buffer("std", torch.ones(targets))

    def forward(self, z: Tensor) -> Tensor:
        return z * self.std + self.mean

    def standardize(self, y: Tensor) -> Tensor:
        return (y - self.mean) / self.std


class Regressor(Task):
    """MSE (or Huber) on standardised targets; RMSE, MAE and R2 logged per stage in the targets' units, over every
    target value (``val/rmse``, min, picks the best checkpoint). Predictions and the exported model give values in
    the targets' units."""

    monitor = "val/rmse"
    mode = "min"
    target_kind = "values"

    def __init__(self, loss: Literal["mse", "huber"] = "mse", huber_delta: float = 1.0, **engine: Any) -> None:
        """
        Args:
            loss: ``mse``, or ``huber`` (quadratic within ``huber_delta`` standard deviations, linear beyond: less
                pulled by outliers).
            huber_delta: where the Huber loss turns linear, in standard deviations of the target.
            **engine: the net, optimizer and schedule settings of ``project.engine.Task``.
        """
        if not huber_delta > 0:
            raise ConfigError(f"model.huber_delta={huber_delta!r}: must be > 0.")
        self.loss_kind, self.huber_delta = loss, huber_delta
        super().__init__(**engine)
        self.targets = Standardization(len(self.target_names))

    def setup(self, stage: str) -> None:
        # From the training split, on every process alike (the split is fixed by its seed); a resumed or loaded
        # checkpoint then restores the same values.
        super().setup(stage)
        datamodule = self.trainer.datamodule  # type: ignore[attr-defined]
        if stage == "fit" and datamodule is not None:
            y = datamodule.split_targets("train").double()
            y = y.reshape(len(y), -1)
            self.targets.mean.copy_(y.mean(0))
            self.targets.std.copy_(y.std(0, correction=0).clamp_min(1e-12))

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        z = self.targets.standardize(targets.reshape(outputs.shape))
        if self.loss_kind == "huber":
            return F.huber_loss(outputs, z, reduction="none", delta=self.huber_delta).mean(-1)
        return F.mse_loss(outputs, z, reduction="none").mean(-1)

    def configure_metrics(self) -> MetricCollection:
        return MetricCollection(
            {"rmse": MeanSquaredError(squared=False), "mae": MeanAbsoluteError(), "r2": R2Score()},
            compute_groups=False,
        )

    def update_metrics(self, metrics: MetricCollection, outputs: Tensor, targets: Tensor) -> None:
        metrics.update(self.prediction(outputs).flatten(), targets.reshape(outputs.shape).flatten())

    def prediction(self, outputs: Tensor) -> Tensor:
        return self.targets(outputs)

    def prediction_table(self, predictions: Tensor) -> tuple[list[str], list[list[Any]]]:
        header = [f"predicted_{name}" for name in self.target_names]
        # Every digit float32 holds (~7): a price of 431756.31 is written 431756.3, not rounded to 431756.
        return header, [[f"{v:.7g}" for v in row] for row in predictions.reshape(len(predictions), -1).tolist()]

    def output_head(self) -> nn.Module:
        return self.targets

    def output_description(self) -> dict[str, Any]:
        return {
            "name": "values",
            "shape": ["batch", len(self.target_names)],
            "targets": self.target_names,
            "units": "the targets' own units (the standardisation is inside the model)",
            "target_mean": self.targets.mean.tolist(),
            "target_std": self.targets.std.tolist(),
        }

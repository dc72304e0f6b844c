"""Your callbacks: one file, each listed in the config (``trainer.callbacks``) to run. A callback sees every hook of
the run (Lightning's ``Callback``); the task's validation and test steps hand each batch's ``outputs`` (the net's) and
``targets`` to ``on_validation_batch_end`` / ``on_test_batch_end``, so a callback needs no second forward pass.

    trainer:
      callbacks:
        - class_path: project.callbacks.OutputHistogram
"""

from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from project.engine import defined_hooks_only


@defined_hooks_only  # Lightning calls only the hooks defined here (not ~11 Python calls per step for each other one)
class OutputHistogram(L.Callback):
    """A histogram of the net's outputs over each validation (TensorBoard's Histograms tab, ``val/outputs``): logits
    that drift apart or collapse show there before the loss says so."""

    def __init__(self, max_values: int = 100_000) -> None:
        """
        Args:
            max_values: the outputs kept per validation (the first ones), so a large model's stay cheap.
        """
        self.max_values = max_values
        self._kept: list[torch.Tensor] = []

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.sanity_checking or sum(t.numel() for t in self._kept) >= self.max_values:
            return
        self._kept.append(outputs["outputs"].detach().flatten().float().cpu())

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        kept, self._kept = self._kept, []
        logger = trainer.logger
        if kept and trainer.is_global_zero and isinstance(logger, TensorBoardLogger):
            values = torch.cat(kept)[: self.max_values]
            logger.experiment.add_histogram("val/outputs", values, global_step=trainer.global_step)

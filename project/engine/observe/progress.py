"""The progress bar: Lightning's ``RichProgressBar``, reading the metrics it shows no more often than it redraws."""

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar

from project.engine.hooks import defined_hooks_only


@defined_hooks_only
class ThrottledProgressBar(RichProgressBar):
    """``RichProgressBar`` that moves its training and validation bars, and reads the metrics it shows, at most
    ``refresh_rate`` times a second (it redraws no more often), and always at an epoch's last batch and end.
    Lightning's does both after every batch, and each read turns every shown metric into a Python float: on a GPU a
    host sync per step, which stalls the queue of kernels (Lightning #20995); on a CPU ~0.1 ms per step."""

    def __init__(self, refresh_rate: int = 4, **kwargs: Any) -> None:
        """
        Args:
            refresh_rate: redraws per second (Lightning's default, 100, costs ~0.5 ms per step on a small model).
            **kwargs: the rest of ``RichProgressBar``'s arguments (``leave``, ``theme``, ``console_kwargs``).
        """
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self._next_update = 0.0

    def _get_train_description(self, current_epoch: int) -> str:
        # A step-based run (max_epochs null, which Lightning keeps as -1) has no last epoch: Lightning 2.6's bar
        # reads "Epoch 0/-2" (Lightning #21925, fixed after 2.6 by #21924). The run's length in steps instead.
        # Private: the bar's only hook for its description; the progress test fails if Lightning renames it.
        if self.trainer.max_epochs in (None, -1) and self.trainer.max_steps > 0:
            return f"Epoch {current_epoch} (a {self.trainer.max_steps}-step run)"
        return super()._get_train_description(current_epoch)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        # Without the logger's version (v_num): the run directory, printed at the start, names it.
        return {k: v for k, v in super().get_metrics(trainer, pl_module).items() if k != "v_num"}

    def _due(self, batch_idx: int, total: float, bar: Any) -> bool:
        """Whether the bar is due a move: its epoch's last batch, a bar not drawn yet, or a redraw's time."""
        now = time.monotonic()
        if now < self._next_update and batch_idx + 1 < total and bar is not None:
            return False
        self._next_update = now + 1 / max(self.refresh_rate, 1)
        return True

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.is_disabled and self._due(batch_idx, self.total_train_batches, self.train_progress_bar_id):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.is_disabled:  # on every rank but 0
            return
        total, bar = self.total_val_batches_current_dataloader, self.val_progress_bar_id
        if trainer.sanity_checking or self._due(batch_idx, total, bar):
            super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

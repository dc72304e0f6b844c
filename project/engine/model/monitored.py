"""The best checkpoint and early stopping, judged by the task's own metric unless the config names another, and
the validation of a run's last step, which both need.

``monitor: null`` (the default here) means the metric the task declares (``Task.monitor``/``Task.mode``, e.g.
``val/acc`` max for the Classifier, ``val/rmse`` min for the Regressor), read when the run starts. A ``monitor``
the config names is kept as given, with its ``mode``; Lightning's own ``ModelCheckpoint`` and ``EarlyStopping``
work as always and are never replaced (torchgeo #1642: a task that builds its callbacks silently drops the user's).
"""

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from torchmetrics import MetricCollection

from project.engine.errors import ConfigError
from project.engine.hooks import defined_hooks_only


def monitor_and_mode(task: str, metrics: MetricCollection, monitor: str) -> tuple[str, Literal["min", "max"]]:
    """The config's ``model.monitor``, one the task logs, with the metric's own direction (torchmetrics'
    ``higher_is_better``; ``val/loss``: min)."""
    directions = {"val/loss": False, **{f"val/{k}": m.higher_is_better for k, m in metrics.items()}}
    if monitor in directions and directions[monitor] is None:  # a metric of the task's own, without a direction
        name = type(metrics[monitor.removeprefix("val/")]).__name__
        raise ConfigError(
            f"model.monitor={monitor!r}: {name} does not say its direction (torchmetrics' class attribute "
            f"higher_is_better is None); set higher_is_better = True or False on {name}, or monitor another metric."
        )
    if monitor not in directions:
        known = ", ".join(sorted(k for k, v in directions.items() if v is not None))
        raise ConfigError(
            f"model.monitor={monitor!r}: {task} logs {known} with a direction (torchmetrics' higher_is_better); "
            "choose one of them, or add the metric to the task."
        )
    return monitor, "max" if directions[monitor] else "min"


def _judged_by(pl_module: L.LightningModule) -> tuple[str, str]:
    monitor, mode = getattr(pl_module, "monitor", None), getattr(pl_module, "mode", None)
    if not isinstance(monitor, str) or mode not in ("min", "max"):
        raise TypeError(f"{type(pl_module).__name__} declares no monitor/mode: name the metric in the callback.")
    return monitor, mode


@defined_hooks_only
class TaskCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` (every argument is Lightning's) whose ``monitor`` defaults to the task's metric."""

    def __init__(self, monitor: str | None = None, mode: Literal["min", "max"] | None = None, **kwargs: Any) -> None:
        self._follows_task = monitor is None
        super().__init__(monitor=monitor, mode=mode or "min", **kwargs)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._follows_task:  # before any checkpoint state is restored: its key names the monitor
            self.monitor, self.mode = _judged_by(pl_module)
            self.kth_value = torch.tensor(-torch.inf if self.mode == "max" else torch.inf)
        super().setup(trainer, pl_module, stage)


@defined_hooks_only
class TaskEarlyStopping(EarlyStopping):
    """``EarlyStopping`` (every argument is Lightning's) whose ``monitor`` defaults to the task's metric."""

    def __init__(self, monitor: str | None = None, mode: Literal["min", "max"] | None = None, **kwargs: Any) -> None:
        self._follows_task = monitor is None
        super().__init__(monitor=monitor or "", mode=mode or "min", **kwargs)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._follows_task:
            self.monitor, self.mode = _judged_by(pl_module)
            self.best_score = torch.tensor(-torch.inf if self.mode == "max" else torch.inf)
            self.min_delta = abs(self.min_delta) * (1 if self.mode == "max" else -1)  # Lightning's sign convention
        super().setup(trainer, pl_module, stage)


@defined_hooks_only
class ValidateTheLastStep(Callback):
    """The last step of a run is always validated, so its best checkpoint and early stopping see it. Lightning
    validates at epoch ends and every ``val_check_interval``, not at ``trainer.max_steps``: a run that stops there
    mid-epoch would end unvalidated (early stopping, checking at the epoch's end, raises on the missing metric);
    nor, with ``check_val_every_n_epoch`` null (validations counted in batches across epochs, as language models
    are trained), at the end of its last epoch. Asking to stop at that step makes Lightning validate it first."""

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        last_batch = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        last_epoch = trainer.max_epochs not in (None, -1) and trainer.current_epoch + 1 >= trainer.max_epochs
        if (0 < trainer.max_steps <= trainer.global_step and not last_batch) or (
            last_batch and last_epoch and trainer.check_val_every_n_epoch is None
        ):
            trainer.should_stop = True

"""The one piece of the sweep inside a trial's ``fit``: a callback the worker adds with ``--trainer.callbacks+=``.

After every validation, rank 0 reports the sweep's metric to the study and asks the pruner; the answer is
broadcast, so every rank of a DDP trial stops at the same epoch (a rank that stopped alone would hang the others
in their next collective). A pruned run ends like an early-stopped one: last.ckpt and best.ckpt are written, the
best checkpoint is tested, and the run shows in TensorBoard's HPARAMS view beside the others.
"""

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from project.engine.errors import ConfigError
from project.engine.hooks import defined_hooks_only


@defined_hooks_only
class SweepTrial(Callback):
    def __init__(self, sweep_dir: str, trial: int) -> None:
        """
        Args:
            sweep_dir: the sweep's directory (its sweep.yaml and study).
            trial: this run's trial number in the study.
        """
        self.sweep_dir, self.trial_number = Path(sweep_dir), trial
        self.metric: str | None = None
        self.pruned_at: int | None = None
        self._trial: Any = None
        self._validations = 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        from project.engine.sweep.spec import build, load
        from project.engine.sweep.study import open_study, trial_id

        spec = load(self.sweep_dir / "sweep.yaml")
        self.metric = spec.metric
        if trainer.is_global_zero:  # the other ranks only follow rank 0's decision
            import optuna

            _, pruner = build(spec)
            study, storage = open_study(spec, self.sweep_dir, pruner=pruner)
            self._trial = optuna.trial.Trial(study, trial_id(study, storage, self.trial_number))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The trial's number and values as tags of its tracker runs (which share the study's experiment)."""
        from project.engine.observe.tracking import TrackerRun

        if self._trial is None:
            return
        tags = {
            "sweep.study": self._trial.study.study_name,
            "sweep.trial": self.trial_number,
            **{f"sweep.{k}": v for k, v in self._trial.params.items()},
        }
        for tracker_run in (cb for cb in trainer.callbacks if isinstance(cb, TrackerRun)):  # type: ignore[attr-defined]
            tracker_run.tag(tags)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.metric is None:
            return
        if self.metric not in trainer.callback_metrics:  # the same on every rank: logged metrics are synced
            raise ConfigError(
                f"the sweep's metric {self.metric!r} is not logged by this run (logged: "
                f"{', '.join(sorted(trainer.callback_metrics)) or 'nothing'}): set metric in the sweep file."
            )
        # One report per validation, numbered from 0: the epoch when validating once per epoch, as usual.
        step, self._validations = self._validations, self._validations + 1
        prune = False
        # At the run's last validation the trial has run in full: it completes, whatever the pruner says.
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
        last = epochs is not None and trainer.current_epoch == epochs - 1 and trainer.is_last_batch
        last = last or 0 < trainer.max_steps <= trainer.global_step
        if trainer.is_global_zero:
            self._trial.report(float(trainer.callback_metrics[self.metric]), step=step)
            prune = self._trial.should_prune() and not last
        if trainer.strategy.broadcast(prune):
            self.pruned_at = trainer.current_epoch
            trainer.should_stop = True  # like EarlyStopping: the epoch ends, its checkpoints are written
            if trainer.is_global_zero:
                self._trial.set_user_attr("pruned_at_epoch", trainer.current_epoch)
            print(
                f"[rank {trainer.global_rank}] trial {self.trial_number} pruned at epoch {trainer.current_epoch} "
                f"({self.metric}={float(trainer.callback_metrics[self.metric]):.4f})",
                flush=True,
            )

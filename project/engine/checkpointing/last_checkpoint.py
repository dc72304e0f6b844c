"""``<run>/checkpoints/last.ckpt``, the checkpoint `make resume` continues from, kept current by one callback:

- at the end of every epoch, after validation, EarlyStopping and the best-checkpoint callback have run;
- every ``every_n_train_steps`` optimizer steps if set (mid-epoch), except on an epoch's last batch, where the
  end-of-epoch save follows: Lightning cannot resume from a save taken between that batch and the validation;
- on Ctrl-C or SIGTERM (preemption), at the next of those points: the current step finishes, last.ckpt is saved
  there, so the resume is exact, and the run stops with ``Interrupted`` (the CLI prints the command that resumes
  it and exits with 128 + the signal number). A second Ctrl-C aborts at once, without saving;
- when a DataLoader worker dies (the out-of-memory killer's SIGKILL, most often), the same way, with
  ``LoaderWorkerDied``: torch's own SIGCHLD handler would raise wherever the training thread is, inside an
  optimizer step included; here the death is recorded and the run stops at the next step boundary. (A death that
  starves the very next batch surfaces earlier, from the loader itself, between two steps.)

It is a ``Checkpoint`` so that Lightning runs it after every other callback, whose state it then includes.
"""

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint
from torch.utils.data._utils import signal_handling

from project.engine.hooks import defined_hooks_only


class Interrupted(Exception):
    def __init__(self, signum: int, checkpoint: Path, step: int, rank: int) -> None:
        super().__init__(f"{signal.Signals(signum).name} after step {step}: saved {checkpoint}")
        self.signum, self.checkpoint, self.step, self.rank = signum, checkpoint, step, rank


class LoaderWorkerDied(RuntimeError):
    """torch's message about the dead worker (or that another process's worker died), and where the run stopped."""

    def __init__(self, message: str, checkpoint: Path, step: int, rank: int) -> None:
        super().__init__(message)
        self.checkpoint, self.step, self.rank = checkpoint, step, rank


@defined_hooks_only
class LastCheckpoint(Checkpoint):
    def __init__(self, every_n_train_steps: int | None = None) -> None:
        """
        Args:
            every_n_train_steps: also save every N optimizer steps, mid-epoch (None: at epoch ends only).
        """
        self.every_n_train_steps = every_n_train_steps
        self.path: Path | None = None
        self.signum: int | None = None
        self.worker_death: str | None = None  # torch's message, once a DataLoader worker of this process died
        self._stop_at_epoch_end = False
        self._saved: Path | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._torch_handler_was_set = False
        self._interrupted = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Beside the other checkpoints (rank 0's run directory, the same on every rank).
        dirpath = next((d for cb in trainer.checkpoint_callbacks if (d := getattr(cb, "dirpath", None))), None)
        local = Path(dirpath or Path(trainer.log_dir or ".") / "checkpoints") / "last.ckpt"
        self.path = Path(trainer.strategy.broadcast(str(local)))

    def _save(self, trainer: L.Trainer) -> None:
        assert self.path is not None
        if not getattr(trainer, "fast_dev_run", False):  # fast_dev_run writes no checkpoint (Lightning's meaning)
            trainer.save_checkpoint(self.path, weights_only=False)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        # Installed after Lightning's own SIGTERM handler, and replacing it: Lightning would raise at its own
        # points in the loop (e.g. right after validation) without saving anything.
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous_handlers[signum] = signal.signal(signum, self._handle)
        # torch installs its SIGCHLD handler once per process, with the first multi-worker loader; the flag keeps a
        # loader made later (this epoch's) from putting it back over ours. Private: torch has no public way to learn
        # of a dead worker but its own handler's check (pytorch #3474); the dead-worker test fails if it changes.
        self._previous_handlers[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, self._child_exited)
        self._torch_handler_was_set = signal_handling._SIGCHLD_handler_set
        signal_handling._SIGCHLD_handler_set = True

    def _child_exited(self, signum: int, frame: FrameType | None) -> None:
        try:
            signal_handling._error_if_any_worker_fails()  # raises only for a failed worker of a live loader
        except RuntimeError as err:
            self.worker_death = self.worker_death or str(err)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C
        self.signum = signum

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        # Never inside an accumulation window: the partial sum of gradients is not part of a checkpoint.
        if self._saved is not None or trainer.fit_loop.epoch_loop._should_accumulate():
            return
        signalled, worker_died = self.signum is not None, self.worker_death is not None
        if trainer.world_size > 1:  # every rank must stop at the same step, for the same reason (one tiny all-reduce)
            flags = torch.tensor([signalled, worker_died], dtype=torch.int32, device=pl_module.device)
            signalled, worker_died = (bool(f) for f in trainer.strategy.reduce(flags, reduce_op="sum").tolist())
        self._interrupted = signalled
        stop = signalled or worker_died
        n = self.every_n_train_steps
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            self._stop_at_epoch_end = stop
        elif stop:
            self._save(trainer)
            self._saved = self.path
        elif n and trainer.global_step % n == 0:
            self._save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save(trainer)
        if self._stop_at_epoch_end:
            self._saved = self.path

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        # Stop here rather than right after saving: Lightning writes a step's logs after on_train_batch_end, and
        # that step is in the checkpoint. The batch fetched for the next step is simply not used.
        if self._saved is None:
            return
        step, rank = trainer.global_step, trainer.global_rank
        if self._interrupted:  # here, or in another process (then most likely SIGTERM: a scheduler signals all)
            raise Interrupted(self.signum or signal.SIGTERM, self._saved, step, rank)
        raise LoaderWorkerDied(self.worker_death or "", self._saved, step, rank)  # here, or another's (it says so)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        if signal.SIGCHLD in self._previous_handlers:
            signal_handling._SIGCHLD_handler_set = self._torch_handler_was_set
        self._previous_handlers.clear()

"""Ctrl-C and SIGTERM (preemption) end a run cleanly: the current optimizer step finishes, ``last.ckpt`` is saved
at that step boundary (the same point as a step-interval checkpoint, so the resume is exact), and the process
exits with 128 + the signal number and the command that resumes it. A second Ctrl-C aborts at once. (If the
signal comes during the last step of an epoch, the epoch's validation and end-of-epoch checkpoint run first.)"""

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L


class Interrupted(Exception):
    def __init__(self, signum: int, checkpoint: Path, step: int, rank: int) -> None:
        super().__init__(f"{signal.Signals(signum).name} after step {step}: saved {checkpoint}")
        self.signum, self.checkpoint, self.step, self.rank = signum, checkpoint, step, rank


class GracefulStop(L.Callback):
    def __init__(self) -> None:
        self.signum: int | None = None
        self._saved: Path | None = None
        self._previous: dict[int, Any] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        # Installed after Lightning's own SIGTERM handler, and replacing it: Lightning would raise at its own
        # points in the loop (e.g. right after validation) without saving anything.
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now, without a checkpoint
        self.signum = signum

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        # Only at the end of an accumulation window: the partial sum of gradients is not part of a checkpoint.
        if self._saved is not None or trainer.fit_loop.epoch_loop._should_accumulate():
            return
        stop = self.signum is not None
        if trainer.world_size > 1:  # every rank must stop at the same step (one tiny all-reduce per step)
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if not stop:
            return
        dirpath = next((d for cb in trainer.checkpoint_callbacks if (d := getattr(cb, "dirpath", None))), None)
        self._saved = Path(dirpath or Path(trainer.log_dir or ".") / "checkpoints") / "last.ckpt"
        trainer.save_checkpoint(self._saved)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        # Stop here, not right after saving: Lightning logs a step's metrics after on_train_batch_end, and that
        # step is in the checkpoint. The batch fetched for the next step is simply not used.
        if self._saved is not None:
            raise Interrupted(self.signum or signal.SIGTERM, self._saved, trainer.global_step, trainer.global_rank)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

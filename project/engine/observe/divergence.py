"""The divergence guard: a run whose loss turns non-finite (nan, inf) does not go on as if it were done, and nothing
non-finite is ever saved.

Every micro-batch's loss is written into a small buffer on the device; nothing is read back per step. The buffer is
read (one host read, plus one tiny all-reduce under DDP so that every process takes the same decision) only where the
run waits for the device anyway: on the steps the logger writes, before any checkpoint is written (the weights and
buffers are checked there too), after each validation (its ``val/loss`` and the task's monitored metric too, so
``best.ckpt`` is never chosen from a non-finite metric) and at the end of training. A non-finite gradient shows one
step later: the weights it reaches turn non-finite, and so does the next loss (or, for weights no loss reads then,
the check before the next checkpoint). ``action`` picks what happens:

- ``stop`` (the default): the run ends with exit 1 and one sentence naming the step, the value and the newest
  checkpoint, written before it and finite. A value seen at step s is read at most ``log_every_n_steps`` steps
  later; nothing is saved in between.
- ``skip``: an optimizer step whose gradient norm is non-finite is not taken: its gradients are dropped (set to
  None, so the optimizer leaves the weights and its own state as they were; the step still counts, for
  ``global_step`` and the LR schedule, as under fp16's GradScaler). Deciding before the step costs one host read
  per step. Skips are logged as ``train/skipped_steps``; more than ``max_skips_in_a_row`` in a row stop the run
  as above.

Under fp16's loss scaling (``16-mixed``) a non-finite gradient is the GradScaler's to handle (it skips the step and
lowers the scale): the loss is watched, and ``skip`` is what the scaler does. A checkpoint saved with
``save_weights_only`` is not seen (Lightning calls no callback for it).
"""

from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.distributed.tensor import DTensor

from project.engine.errors import ConfigError
from project.engine.hooks import defined_hooks_only
from project.engine.model.accumulation import is_last_micro_batch

WINDOW = 256  # values buffered on the device between two reads; a full buffer is read (and emptied) at once


class Diverged(Exception):
    """The run stopped on a non-finite value: ``found`` says where, the message what was kept too."""

    def __init__(self, message: str, found: str, rank: int) -> None:
        super().__init__(message)
        self.found, self.rank = found, rank


def _local(t: Tensor) -> Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@defined_hooks_only
class DivergenceGuard(Callback):
    def __init__(self, action: Literal["stop", "skip"] = "stop", max_skips_in_a_row: int = 10) -> None:
        """
        Args:
            action: what a non-finite loss or gradient norm does: stop (the run ends, exit 1) or skip (the optimizer
                step is not taken; one host read per step).
            max_skips_in_a_row: with skip, this many skipped steps in a row are followed by a stop.
        """
        if max_skips_in_a_row < 1:
            raise ConfigError(f"DivergenceGuard's max_skips_in_a_row={max_skips_in_a_row}: it must be 1 or more.")
        self.action, self.max_skips_in_a_row = action, max_skips_in_a_row
        self.skipped = 0  # steps skipped in this run (kept in the checkpoint)
        self._in_a_row = 0
        self._values: Tensor | None = None
        self._seen: list[tuple[int, str]] = []  # (optimizer step, what) of each buffered value
        self._saved_at: int | None = None  # the step of the newest checkpoint this guard let through

    # ---- watching, on the device -------------------------------------------------------------------------------

    def _watch(self, trainer: L.Trainer, value: Tensor, what: str) -> None:
        if len(self._seen) == WINDOW:
            self._stop_if_diverged(trainer)
        if self._values is None or self._values.device != value.device:
            self._values = torch.empty(WINDOW, dtype=torch.float32, device=value.device)
        self._values[len(self._seen)] = value.detach()
        self._seen.append((trainer.global_step + 1, what))

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor) -> None:
        if self.action == "stop" or self._scaled(trainer):  # skip decides from the gradient norm, the same everywhere
            self._watch(trainer, loss, "the loss")

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if self.action == "stop" or self._scaled(trainer):
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return
        norm = torch.nn.utils.get_total_norm(grads)
        # After DDP's reduction the gradients are the same on every process, so is this decision (FSDP: the norm
        # over every shard, one all-reduce).
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        if bool(torch.isfinite(norm)):
            self._in_a_row = 0
            return
        optimizer.zero_grad(set_to_none=True)  # no gradient: torch's optimizers leave the parameter and its state
        self.skipped += 1
        self._in_a_row += 1
        if self._in_a_row > self.max_skips_in_a_row:
            self._stop(trainer, f"the gradient norm was {float(norm)} at {self._in_a_row} optimizer steps in a row, "
                       f"the last step {trainer.global_step + 1}")  # fmt: skip

    @staticmethod
    def _scaled(trainer: L.Trainer) -> bool:
        return getattr(trainer.precision_plugin, "scaler", None) is not None

    # ---- reading, where the run syncs anyway ---------------------------------------------------------------------

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        every = trainer.log_every_n_steps  # type: ignore[attr-defined]
        if every > 0 and is_last_micro_batch(trainer) and trainer.global_step % every == 0:  # a logging step
            self._stop_if_diverged(trainer)
            if self.action == "skip":
                for logger in trainer.loggers:  # a host number: straight to the loggers, as TrainingMonitor's
                    logger.log_metrics({"train/skipped_steps": float(self.skipped)}, step=trainer.global_step - 1)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        judged = dict.fromkeys(("val/loss", getattr(pl_module, "monitor", "val/loss")))
        bad = next((k for k in judged if k in metrics and not torch.isfinite(metrics[k]).all()), None)
        found = f"{bad} was {float(metrics[bad])} at the validation after step {trainer.global_step}" if bad else None
        self._stop_if_diverged(trainer, found)  # before the best checkpoint and early stopping see it

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        tensors = [_local(t) for t in (*pl_module.parameters(), *pl_module.buffers()) if t.is_floating_point()]
        found = None
        if tensors and not bool(torch.stack([t.isfinite().all() for t in tensors]).all()):
            name = next(n for n, t in (*pl_module.named_parameters(), *pl_module.named_buffers())
                        if t.is_floating_point() and not _local(t).isfinite().all())  # fmt: skip
            found = f"{name} held non-finite values at step {trainer.global_step}"
        self._stop_if_diverged(trainer, found)
        self._saved_at = trainer.global_step

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_if_diverged(trainer)

    def _first_non_finite(self) -> str | None:
        """Reads the buffer (the one host read) and empties it: the first non-finite value in it, in words."""
        if not self._seen:
            return None
        assert self._values is not None
        values, seen = self._values[: len(self._seen)], list(self._seen)
        self._seen.clear()
        finite = torch.isfinite(values)
        if bool(finite.all()):
            return None
        i = int((~finite).nonzero()[0, 0])
        return f"{seen[i][1]} was {float(values[i])} at optimizer step {seen[i][0]}"

    def _stop_if_diverged(self, trainer: L.Trainer, found: str | None = None) -> None:
        """Raises ``Diverged`` on every process if any process saw a non-finite value since the last read (the
        earliest is named), or ``found`` one."""
        found = self._first_non_finite() or found
        diverged = found is not None
        if trainer.world_size > 1:
            diverged = trainer.strategy.reduce_boolean_decision(diverged, all=False)
        if diverged:
            self._stop(trainer, found or "another process saw a non-finite value")

    def _stop(self, trainer: L.Trainer, found: str) -> None:
        """Raises ``Diverged``: ``found``, and the newest checkpoint, which was written before it."""
        directories = {Path(d) for cb in trainer.checkpoint_callbacks if (d := getattr(cb, "dirpath", None))}
        directories |= {Path(p).parent for cb in trainer.checkpoint_callbacks if (p := getattr(cb, "path", None))}
        written = sorted((f for d in directories for f in d.glob("*.ckpt")), key=lambda f: f.stat().st_mtime)
        when = f" (after step {self._saved_at})" if self._saved_at is not None else ""
        kept = (
            f"the newest checkpoint, {written[-1]}, was written before it{when} and holds finite values only, and "
            "none was written after it"
            if written
            else "no checkpoint was written"
        )
        advice = "lower the learning rate or warm up longer"
        if self.action == "stop":
            advice += ", or let the DivergenceGuard callback skip such steps (action: skip)"
        raise Diverged(f"the run diverged: {found}; {kept}. To go on, {advice}.", found, trainer.global_rank)

    # ---- resume ----------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped, "in_a_row": self._in_a_row}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped, self._in_a_row = state_dict["skipped"], state_dict["in_a_row"]

"""Linear warmup then cosine decay, stepped once per optimizer step."""

import math

from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from project.engine.errors import ConfigError


def warmup_cosine_lr(step: int, peak_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """The learning rate used by optimizer step ``step`` (0-based) of a ``total_steps``-step run.

    Warmup climbs linearly from ``peak_lr / warmup_steps`` to ``peak_lr`` over steps ``0 .. warmup_steps-1``;
    the cosine then falls from ``peak_lr`` at step ``warmup_steps`` to exactly ``min_lr`` at the final
    step ``total_steps - 1`` and stays there.
    """
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    decay_steps = total_steps - 1 - warmup_steps
    progress = 1.0 if decay_steps <= 0 else min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr + (peak_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def planned_steps(batches_per_epoch: int, accumulate_grad_batches: int, max_epochs: int, max_steps: int = -1) -> int:
    """The run's number of optimizer steps, as Lightning's ``trainer.estimated_stepping_batches`` computes it
    (one process; with several, ``batches_per_epoch`` is per process)."""
    if max_epochs < 0:  # no epoch limit
        return max_steps
    steps = math.ceil(batches_per_epoch / accumulate_grad_batches) * max_epochs
    return steps if max_steps < 0 else min(steps, max_steps)


def check_warmup(warmup: int | float) -> None:
    """``warmup`` is a step count (an int >= 0) or a fraction of the run (a float in [0, 1))."""
    if isinstance(warmup, float) and not 0.0 <= warmup < 1.0:
        raise ConfigError(f"model.warmup={warmup!r}: a fraction of the run must lie in [0, 1) (or give an int).")
    if isinstance(warmup, int) and warmup < 0:
        raise ConfigError(f"model.warmup={warmup!r}: a number of warmup steps must be >= 0.")


def resolve_warmup_steps(warmup: int | float, total_steps: int) -> int:
    """The number of warmup steps: ``warmup`` itself if an int, else that fraction of ``total_steps`` rounded up."""
    check_warmup(warmup)
    return math.ceil(warmup * total_steps) if isinstance(warmup, float) else warmup


class WarmupCosine(LRScheduler):
    """``warmup_cosine_lr`` for every param group (each from its own initial lr).

    The closed form is recomputed from the step counter rather than updated multiplicatively, so a resumed
    scheduler (whose state is just ``last_epoch``) continues on exactly the same curve. A run resumed with another
    length (``make resume ARGS="--trainer.max_epochs=..."``) keeps the plan of that length: its remaining steps
    follow the curve of a run planned that long from the start, and one line says so (the checkpoint's plan would
    leave every added step at ``min_lr``).
    """

    def __init__(
        self, optimizer: Optimizer, warmup_steps: int, total_steps: int, min_lr: float, lr: float | None = None
    ) -> None:
        """``min_lr`` is that of a group whose initial lr is ``lr``; a group starting at another lr (a backbone at
        ``lr`` x 0.1) ends at ``min_lr`` times the same ratio, so its whole curve is the reference one scaled.
        Without ``lr``, every group ends at ``min_lr``."""
        if not 0 <= warmup_steps < total_steps:
            raise ConfigError(
                f"model.warmup resolves to {warmup_steps} warmup steps, but the run has only {total_steps} "
                "optimizer steps; warmup must be shorter than the run (lower model.warmup or train longer)."
            )
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_lr = min_lr
        self.reference_lr = lr
        super().__init__(optimizer)

    def load_state_dict(self, state_dict: dict) -> None:
        planned = (self.warmup_steps, self.total_steps)
        super().load_state_dict(state_dict)
        if planned != (self.warmup_steps, self.total_steps):
            # Imported here: the schedule is plain torch (the bench's hand-written loop uses it without Lightning).
            from lightning.pytorch.utilities import rank_zero_info

            rank_zero_info(
                f"The run length changed: the LR schedule is re-planned from {self.total_steps} to {planned[1]} "
                f"optimizer steps (warmup {planned[0]}); from step {self.last_epoch} on it follows the curve of a run "
                f"of {planned[1]} steps."
            )
            self.warmup_steps, self.total_steps = planned
        # The optimizer's state (restored just before) holds the LR the old plan chose for the next step.
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_lr(self) -> list[float | Tensor]:
        return [
            warmup_cosine_lr(self.last_epoch, float(base_lr), self._min_lr(float(base_lr)), self.warmup_steps,
                             self.total_steps)
            for base_lr in self.base_lrs
        ]  # fmt: skip

    def _min_lr(self, base_lr: float) -> float:
        if self.reference_lr is None or base_lr == self.reference_lr:
            return self.min_lr
        return self.min_lr * base_lr / self.reference_lr

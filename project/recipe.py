"""The recipe: the optimizer's parameter groups and the learning-rate schedules. Yours to read and to edit.

The optimizer and the schedule are config (``model.optimizer``, ``model.schedule``), as LightningCLI injects them:

    model:
      init_args:
        optimizer:                      # any torch.optim optimizer, with its own arguments
          class_path: torch.optim.SGD
          init_args: {lr: 0.05, momentum: 0.9, nesterov: true, weight_decay: 1.0e-4}
        warmup: 0.05                    # optimizer steps (an int) or a fraction of the run's (a float)
        schedule:                       # a class here, or your own: built as cls(optimizer, total_steps, warmup_steps)
          class_path: project.recipe.WarmupLinear
          init_args: {min_lr: 0.0}
        param_groups: project.recipe.param_groups   # which parameters decay

The optimizer's ``lr`` is the peak, reached at the end of warmup; every schedule is a closed form of the optimizer
step (nanoGPT's ``get_lr``), so a resumed run continues on exactly the same curve. The machinery around them (the
optimizer over these groups, the run's length, the warmup) is the engine's: ``project/engine/model/optimization.py``.
"""

import math
from typing import Any, Literal

from torch import nn
from torch.optim import Optimizer

from project.engine import ConfigError, WarmupSchedule


def param_groups(parameters: list[tuple[str, nn.Parameter]]) -> list[dict[str, Any]]:
    """Which parameters decay (nanoGPT's rule): weight matrices and conv kernels at the optimizer's ``weight_decay``,
    biases and normalisation weights at none. Called with the (name, parameter) pairs to train (a fine-tuned
    backbone's and the head's apart); each group may set its own ``lr_scale`` (times the optimizer's lr) and ``name``
    (its LR curve, ``lr-AdamW/decay``)."""
    return [
        {"params": [p for _, p in parameters if p.ndim >= 2], "name": "decay"},
        {"params": [p for _, p in parameters if p.ndim < 2], "name": "no_decay", "weight_decay": 0.0},
    ]


class WarmupCosine(WarmupSchedule):
    """Warmup, then a cosine from the peak down to ``min_lr`` at the run's last step (the default)."""

    def decay(self, step: int, peak: float, floor: float) -> float:
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * self.progress(step)))


class WarmupLinear(WarmupSchedule):
    """Warmup, then a straight line from the peak down to ``min_lr`` at the run's last step."""

    def decay(self, step: int, peak: float, floor: float) -> float:
        return floor + (peak - floor) * (1.0 - self.progress(step))


class WarmupConstant(WarmupSchedule):
    """Warmup, then the peak to the end."""

    def __init__(self, optimizer: Optimizer, total_steps: int, warmup_steps: int) -> None:
        super().__init__(optimizer, total_steps, warmup_steps)

    def decay(self, step: int, peak: float, floor: float) -> float:
        return peak


class WarmupStableDecay(WarmupSchedule):
    """Warmup, the peak, then a decay to ``min_lr`` over the run's last ``ceil(decay_fraction * total_steps)`` steps
    (WSD: Hu et al. 2024, arXiv:2404.06395; the 1-sqrt shape from Hägele et al. 2024, arXiv:2405.18392)."""

    def __init__(
        self,
        optimizer: Optimizer,
        total_steps: int,
        warmup_steps: int,
        min_lr: float = 0.0,
        decay_fraction: float = 0.2,
        shape: Literal["linear", "1-sqrt", "cosine"] = "1-sqrt",
    ) -> None:
        if not 0.0 < decay_fraction <= 1.0:
            raise ConfigError(f"model.schedule.decay_fraction={decay_fraction!r}: a fraction of the run in (0, 1].")
        self.decay_fraction, self.shape = decay_fraction, shape
        super().__init__(optimizer, total_steps, warmup_steps, min_lr)

    def decay(self, step: int, peak: float, floor: float) -> float:
        # The peak up to step S-1-D, the floor at S-1: D steps below the peak (none inside the warmup).
        start = max(self.warmup_steps, self.total_steps - 1 - math.ceil(self.decay_fraction * self.total_steps))
        span = self.total_steps - 1 - start
        q = 1.0 if span <= 0 else min(1.0, max(0.0, (step - start) / span))
        kept = {"linear": 1.0 - q, "1-sqrt": 1.0 - math.sqrt(q), "cosine": 0.5 * (1.0 + math.cos(math.pi * q))}
        return floor + (peak - floor) * kept[self.shape]

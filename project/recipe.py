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

The optimizer's ``lr`` is the peak, reached at the end of warmup; every schedule is a closed form of the optimizer
step (nanoGPT's ``get_lr``), so a resumed run continues on exactly the same curve.
"""

import math
from collections.abc import Callable, Iterable
from typing import Any, Literal

from torch import Tensor, nn
from torch.optim import Optimizer, SparseAdam
from torch.optim.lr_scheduler import LRScheduler

from project.engine.errors import ConfigError

# What LightningCLI injects: the optimizer class (or a partial of it) with the config's arguments, called with the
# parameter groups; the schedule likewise, called with the optimizer, the run's optimizer steps and its warmup steps.
OptimizerCallable = Callable[[Iterable], Optimizer]
ScheduleCallable = Callable[[Optimizer, int, int], LRScheduler]


def param_groups(model: nn.Module, backbone: nn.Module | None = None, backbone_lr_scale: float = 1.0) -> list[dict]:
    """Weight matrices and conv kernels decay (at the optimizer's ``weight_decay``); biases and normalisation weights
    do not (nanoGPT's rule). With a ``backbone`` (being fine-tuned), its two groups come first, each with an
    ``lr_scale`` that ``build_optimizer`` applies to the optimizer's peak lr."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    parts: list[tuple[str, float, list[nn.Parameter]]] = [("", 1.0, trainable)]
    if backbone is not None:
        inside = {id(p) for p in backbone.parameters()}
        parts = [("backbone", backbone_lr_scale, [p for p in trainable if id(p) in inside]),
                 ("head", 1.0, [p for p in trainable if id(p) not in inside])]  # fmt: skip
    groups = []
    for part, scale, params in parts:
        decay = {"params": [p for p in params if p.ndim >= 2], "lr_scale": scale}
        no_decay = {"params": [p for p in params if p.ndim < 2], "lr_scale": scale, "weight_decay": 0.0}
        if part:  # named in the LR curves (lr-AdamW/backbone/decay); the plain split keeps pg1, pg2
            decay["name"], no_decay["name"] = f"{part}/decay", f"{part}/no_decay"
        groups += [decay, no_decay]
    return groups


def build_optimizer(optimizer: OptimizerCallable, groups: list[dict]) -> Optimizer:
    """``optimizer`` over ``groups``, each group's lr its ``lr_scale`` times the optimizer's own (the peak)."""
    lr = getattr(optimizer, "keywords", {}).get("lr")  # what the config gave (LightningCLI injects a partial)
    if lr is not None and not lr > 0:
        raise ConfigError(f"model.optimizer.lr={lr!r}: the peak learning rate must be > 0.")
    try:
        built = optimizer(groups)
    except ValueError as err:  # torch's own checks; LBFGS: "doesn't support per-parameter options (parameter groups)"
        raise ConfigError(
            f"model.optimizer: {str(err).rstrip('.')}, which the recipe uses (weight decay on weight matrices only, "
            "a backbone's LR scale): choose an optimizer that takes them, e.g. AdamW or SGD."
            if "parameter groups" in str(err)
            else f"model.optimizer: {err}"
        ) from None
    if isinstance(built, SparseAdam):  # it fails at the first step, on any net with dense gradients
        raise ConfigError("model.optimizer=SparseAdam: it takes sparse gradients only (nn.Embedding(sparse=True)); "
                          "choose one for dense gradients, e.g. AdamW or SGD.")  # fmt: skip
    for group in built.param_groups:
        group["lr"] = built.defaults["lr"] * group["lr_scale"]  # x 1.0 is exact: the plain groups are at the peak
    return built


class WarmupSchedule(LRScheduler):
    """Linear warmup from ``peak / warmup_steps`` to the peak over steps ``0 .. warmup_steps - 1``, then ``decay``.

    Each group follows the curve from its own initial lr (its peak); ``min_lr`` is the floor of a group at the
    optimizer's lr, and a group at another lr (a backbone at 0.1x) ends at ``min_lr`` times the same ratio. A run
    resumed with another length keeps the plan of that length (one line says so): its remaining steps follow the
    curve of a run planned that long from the start, as the checkpoint's plan would leave every added step at the
    floor.
    """

    def __init__(self, optimizer: Optimizer, total_steps: int, warmup_steps: int, min_lr: float = 0.0) -> None:
        if not 0 <= warmup_steps < total_steps:
            raise ConfigError(
                f"model.warmup resolves to {warmup_steps} warmup steps, but the run has only {total_steps} "
                "optimizer steps; warmup must be shorter than the run (lower model.warmup or train longer)."
            )
        self.reference_lr = float(optimizer.defaults["lr"])
        if not 0 <= min_lr <= self.reference_lr:
            raise ConfigError(
                f"model.schedule.min_lr={min_lr!r}: the floor must lie in [0, the optimizer's lr={self.reference_lr}]."
            )
        self.total_steps, self.warmup_steps, self.min_lr = total_steps, warmup_steps, min_lr
        super().__init__(optimizer)

    def decay(self, step: int, peak: float, floor: float) -> float:
        """The lr of a step at or after warmup, for a group whose curve runs from ``peak`` to ``floor``."""
        raise NotImplementedError

    def progress(self, step: int) -> float:
        """How far the decay is at ``step``: 0 at the end of warmup, 1 at the run's last step."""
        decay_steps = self.total_steps - 1 - self.warmup_steps
        return 1.0 if decay_steps <= 0 else min(1.0, (step - self.warmup_steps) / decay_steps)

    def get_lr(self) -> list[float | Tensor]:
        lrs: list[float | Tensor] = []
        for base_lr in map(float, self.base_lrs):
            if self.last_epoch < self.warmup_steps:
                lrs.append(base_lr * (self.last_epoch + 1) / self.warmup_steps)
            else:
                floor = self.min_lr if base_lr == self.reference_lr else self.min_lr * base_lr / self.reference_lr
                lrs.append(self.decay(self.last_epoch, base_lr, floor))
        return lrs

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        planned = (self.warmup_steps, self.total_steps)
        super().load_state_dict(state_dict)
        if planned != (self.warmup_steps, self.total_steps):
            from lightning.pytorch.utilities import rank_zero_info  # here: the recipe itself is plain torch

            rank_zero_info(
                f"The run length changed: the LR schedule is re-planned from {self.total_steps} to {planned[1]} "
                f"optimizer steps (warmup {planned[0]}); from step {self.last_epoch} on it follows the curve of a run "
                f"of {planned[1]} steps."
            )
            self.warmup_steps, self.total_steps = planned
        # The optimizer's state (restored just before) holds the lr the old plan chose for the next step.
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


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


def planned_steps(batches_per_epoch: int, accumulate_grad_batches: int, max_epochs: int, max_steps: int = -1) -> int:
    """The run's number of optimizer steps, as Lightning's ``trainer.estimated_stepping_batches`` computes it
    (one process; with several, ``batches_per_epoch`` is per process)."""
    if max_epochs < 0:  # no epoch limit
        return max_steps
    steps = math.ceil(batches_per_epoch / accumulate_grad_batches) * max_epochs
    return steps if max_steps < 0 else min(steps, max_steps)


def planned_run(trainer: Any, warmup: int | float) -> tuple[int, int]:
    """The run's optimizer steps (``trainer.estimated_stepping_batches``) and its warmup steps."""
    total = trainer.estimated_stepping_batches
    if not math.isfinite(total):
        raise ConfigError(
            "The run length is unknown (infinite data and no trainer.max_steps); set trainer.max_steps so the "
            "LR schedule knows where it ends."
        )
    total = int(total)
    warmup_steps = resolve_warmup_steps(warmup, total)
    if getattr(trainer, "fast_dev_run", False):  # a smoke test of a few batches: the curve squeezed in
        warmup_steps = min(warmup_steps, total - 1)
    return total, warmup_steps


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

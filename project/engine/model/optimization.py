"""The recipe's machinery: the optimizer over parameter groups, the run's length in optimizer steps, and the base of
every warmup schedule. What an owner edits, which parameters decay and the schedules' shapes, is in
``project/recipe.py``, which the config names (``model.param_groups``, ``model.schedule``) as it names any class."""

import math
from collections.abc import Callable, Iterable
from typing import Any

from torch import Tensor, nn
from torch.optim import LBFGS, Optimizer, SparseAdam
from torch.optim.lr_scheduler import LRScheduler

from project.engine.errors import ConfigError

# What LightningCLI injects: the optimizer class (or a partial of it) with the config's arguments, called with the
# parameter groups; the schedule likewise, called with the optimizer, the run's optimizer steps and its warmup steps;
# the parameter-group rule, called with the (name, parameter) pairs it splits into torch's parameter groups.
OptimizerCallable = Callable[[Iterable], Optimizer]
ScheduleCallable = Callable[[Optimizer, int, int], LRScheduler]
ParamGroupsCallable = Callable[[list[tuple[str, nn.Parameter]]], list[dict[str, Any]]]


def optimizer_groups(
    module: nn.Module,
    rule: ParamGroupsCallable | None,
    backbone: nn.Module | None = None,
    backbone_lr_scale: float = 1.0,
) -> list[dict[str, Any]]:
    """``module``'s trainable parameters in the groups ``rule`` makes of them (None: one group). With a ``backbone``
    (being fine-tuned) the rule splits its parameters and the rest apart, its groups first, their ``lr_scale`` (which
    ``build_optimizer`` applies) times ``backbone_lr_scale``, named ``backbone/<name>`` and ``head/<name>`` in the LR
    curves."""
    trainable = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    parts: list[tuple[str, float, list[tuple[str, nn.Parameter]]]] = [("", 1.0, trainable)]
    if backbone is not None:
        inside = {id(p) for p in backbone.parameters()}
        parts = [
            ("backbone", backbone_lr_scale, [(n, p) for n, p in trainable if id(p) in inside]),
            ("head", 1.0, [(n, p) for n, p in trainable if id(p) not in inside]),
        ]
    groups = []
    for part, scale, named in parts:
        for i, group in enumerate(rule(named) if rule is not None else [{"params": [p for _, p in named]}], 1):
            if part:
                group["name"] = f"{part}/{group.get('name', f'pg{i}')}"
            groups.append({**group, "lr_scale": scale * group.get("lr_scale", 1.0)})
    return groups


def build_optimizer(optimizer: OptimizerCallable, groups: list[dict]) -> Optimizer:
    """``optimizer`` over ``groups``, each group's lr its ``lr_scale`` (default 1) times the optimizer's own (the
    peak)."""
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
        raise ConfigError(
            "model.optimizer=SparseAdam: it takes sparse gradients only (nn.Embedding(sparse=True)); "
            "choose one for dense gradients, e.g. AdamW or SGD."
        )
    for group in built.param_groups:
        group["lr"] = built.defaults["lr"] * group.setdefault("lr_scale", 1.0)  # x 1.0 is exact
    return built


def refuse_accumulation_across_closure_calls(optimizer: Optimizer, accumulate_grad_batches: int) -> None:
    """LBFGS calls its closure (forward and backward on the stepping batch) several times per step, each from zeroed
    gradients only when no window is open: under accumulation the window's earlier batches' gradients are added to
    every call's, and the run trains on nonsense without a word (test/acc 0.09 where 0.88 without)."""
    if isinstance(optimizer, LBFGS) and accumulate_grad_batches > 1:
        raise ConfigError(
            f"model.optimizer=LBFGS with trainer.accumulate_grad_batches={accumulate_grad_batches}: LBFGS evaluates "
            "the loss several times per step on the stepping batch alone, so the window's other batches cannot "
            "take part; set trainer.accumulate_grad_batches=1 (a larger data.batch_size gives the larger batch)."
        )


class WarmupSchedule(LRScheduler):
    """Linear warmup from ``peak / warmup_steps`` to the peak over steps ``0 .. warmup_steps - 1``, then ``decay``
    (here: the peak to the end; a schedule of ``project/recipe.py`` says how it decays).

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
        return peak

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
            from lightning.pytorch.utilities import rank_zero_info  # here: a schedule alone is plain torch

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


def describe_recipe(trainer: Any) -> str:
    """The recipe as it runs, one line each (the console prints it as training starts): every optimizer with its
    arguments and its groups' own, the schedule with the run's length and warmup, clipping and accumulation. A script
    moved in is matched key by key against this."""
    lines = []
    for optimizer in trainer.optimizers:
        defaults = optimizer.defaults
        given = ", ".join(f"{k}={_short(v)}" for k, v in defaults.items() if _shown(v))
        groups = []
        for i, group in enumerate(optimizer.param_groups, 1):
            own = {k: v for k, v in group.items() if k not in ("params", "name", "lr", "initial_lr") and _shown(v)
                   and v != defaults.get(k, 1.0 if k == "lr_scale" else None)}  # fmt: skip
            extra = "".join(f", {k}={_short(v)}" for k, v in own.items())
            groups.append(f"{group.get('name', f'pg{i}')} ({len(group['params'])} tensors{extra})")
        lines.append(f"Optimizer: {type(optimizer).__name__}({given}); groups: {', '.join(groups)}")
    for config in trainer.lr_scheduler_configs:
        schedule = config.scheduler
        if isinstance(schedule, WarmupSchedule):
            lines.append(f"Schedule: {type(schedule).__name__}(min_lr={_short(schedule.min_lr)}) per optimizer step, "
                         f"{schedule.total_steps} steps, {schedule.warmup_steps} of warmup")  # fmt: skip
        else:
            lines.append(f"Schedule: {type(schedule).__name__}, every {config.frequency} {config.interval}")
    clip = trainer.gradient_clip_val
    algorithm = getattr(trainer.gradient_clip_algorithm, "value", trainer.gradient_clip_algorithm) or "norm"
    clipping = f"by {algorithm} at {clip}" if clip else "none"
    lines.append(f"Clipping: {clipping}; accumulation: {trainer.accumulate_grad_batches} batch(es) per optimizer step")
    return "\n".join(lines)


def _shown(value: Any) -> bool:
    return value is not None and value is not False and not callable(value)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_short(v) for v in value) + ")"
    return str(value)

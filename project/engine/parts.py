"""Several optimizers, one per part of the net (a GAN's generator and discriminator), each with the recipe's
parameter groups and a schedule of its own, stepped by the task itself (``Task.manual_step``) under Lightning's
manual optimization."""

from typing import Any

from torch import Tensor, nn

from project.engine.errors import ConfigError
from project.engine.optimization import OptimizerCallable, build_optimizer, optimizer_groups, planned_run


def configure(task: Any, optimizers: dict[str, OptimizerCallable]) -> list[dict[str, Any]]:
    """``configure_optimizers``' answer: an optimizer and a schedule per part of the net ``optimizers`` names."""
    if task.automatic_optimization:
        raise ConfigError(
            f"model.optimizers names {list(optimizers)}: several optimizers are stepped by the task itself, and "
            f"{type(task).__name__} leaves automatic_optimization on; set self.automatic_optimization = False in its "
            "__init__ and step each with self.manual_step(part, loss)."
        )
    total, warmup = planned_run(task.trainer, task.hparams["warmup"])
    steps = []
    for part, make in optimizers.items():
        module = getattr(task.net, part, None)
        if not isinstance(module, nn.Module):
            names = [name for name, _ in task.net.named_children()]
            raise ConfigError(f"model.optimizers names {part!r}, which is no part of the net; its parts: {names}.")
        optimizer = build_optimizer(make, optimizer_groups(module, task.param_groups))
        scheduler = {"scheduler": task.schedule(optimizer, total, warmup), "interval": "step", "name": f"lr-{part}"}
        steps.append({"optimizer": optimizer, "lr_scheduler": scheduler})
    return steps


def step(task: Any, part: str, loss: Tensor) -> None:
    """``Task.manual_step``: back-propagate into ``part`` alone, clip, step its optimizer and its schedule."""
    names = list(task.optimizers_of_parts or {})
    if part not in names:
        raise ConfigError(
            f"{type(task).__name__}.manual_step({part!r}): model.optimizers names {names}; give each part of the net "
            "stepped here an optimizer there."
        )
    index = names.index(part)
    optimizer = _listed(task.optimizers())[index]
    task.toggle_optimizer(optimizer)
    optimizer.zero_grad(set_to_none=True)
    task.manual_backward(loss)
    value, algorithm = task.gradient_clipping
    if value:
        task.clip_gradients(optimizer, gradient_clip_val=value, gradient_clip_algorithm=algorithm)
    # Private: Lightning counts every optimizer's step in global_step (Lightning #17958, open; PR #19589), so two
    # optimizers would halve max_steps and the schedules, and a part that stops stepping (staged training) would
    # freeze it, and with it ModelCheckpoint, which saves once per global_step. A batch counts once, whichever part
    # steps first in it; the loop sets these two hooks again at every batch.
    batch = task.trainer.fit_loop.epoch_loop.batch_progress.total.ready
    if getattr(task, "_counted_batch", None) == batch:
        optimizer._on_before_step = optimizer._on_after_step = _nothing
    task._counted_batch = batch
    optimizer.step()
    _listed(task.lr_schedulers())[index].step()
    task.untoggle_optimizer(optimizer)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _nothing() -> None:
    pass

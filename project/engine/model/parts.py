"""Several optimizers, one per part of the net (a GAN's generator and discriminator), each with the recipe's
parameter groups and a schedule of its own, stepped by the task itself (``Task.manual_step``) under Lightning's
manual optimization."""

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from project.engine.errors import ConfigError
from project.engine.model.optimization import OptimizerCallable, build_optimizer, optimizer_groups, planned_run


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
    optimizer.step()
    _listed(task.lr_schedulers())[index].step()
    task.untoggle_optimizer(optimizer)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def count_each_batch_once(trainer: Any) -> None:
    """Under manual optimization, a batch counts as one step of the run however many optimizer steps it takes and
    whichever optimizers take them (``manual_step`` or the task's own ``opt.step()``): ``max_steps`` is batches, the
    schedules are planned in batches, and a part that stops stepping (staged training) freezes nothing.

    Private: Lightning counts every optimizer step in ``global_step`` (Lightning #17958, open; PR #19589), through
    the two hooks its manual loop hands each optimizer at every batch; here those two count once per batch.
    """
    loop = trainer.fit_loop.epoch_loop.manual_optimization
    batches = trainer.fit_loop.epoch_loop.batch_progress.total
    counted = {"before": -1, "after": -1}

    def once(when: str, hook: Callable[[], None]) -> Callable[[], None]:
        def counting() -> None:
            if counted[when] != batches.ready:
                counted[when] = batches.ready
                hook()

        return counting

    loop._on_before_step = once("before", type(loop)._on_before_step.__get__(loop))
    loop._on_after_step = once("after", type(loop)._on_after_step.__get__(loop))

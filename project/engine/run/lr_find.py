"""``make lr-find``: Lightning's LR range test (``Tuner.lr_find``) on the config's own task, data and optimizer.

The learning rate rises exponentially from ``--min_lr`` to ``--max_lr`` over ``--steps`` optimizer steps, one batch
each, from the task's initial weights; the loss is recorded at each and the weights are restored after. The range
test replaces the config's schedule while it runs; the optimizer, its other arguments, the parameter groups, clipping
and accumulation are the config's. The run directory gets the loss-vs-LR plot (``lr_find.png``, and in TensorBoard's
Images tab), its ``provenance.json`` the suggestion; the suggestion (Lightning's: the steepest descent of the
smoothed loss) is printed with the flag and the config line that use it. Read the curve before trusting the
number: a learning rate somewhat below where the loss turns up is the usual choice.

The task's learning rate is the optimizer's ``lr`` inside the config, not an attribute of the task, so Lightning's
``LearningRateFinder`` callback, which looks for ``lr``/``learning_rate`` on the task to overwrite, fails there
(Lightning #16787): this command leaves the config as it is and says what to change.
"""

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.tuner import Tuner

from project.engine.errors import ConfigError
from project.engine.observe.provenance import Provenance, now
from project.engine.run.cli import CLI
from project.engine.run.faults import run_with_exit_codes

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def lr_find(args: list[str], min_lr: float, max_lr: float, steps: int) -> float:
    """The range test of the config ``args`` give (``--config`` files and flags, as ``fit`` takes them); returns
    the suggested learning rate."""
    cli = CLI(args, run=False)
    task, trainer = cli.model, cli.trainer
    if not task.automatic_optimization:
        raise ConfigError(
            f"{type(task).__name__} steps its optimizers itself (manual optimization): Lightning's LR range test "
            "steps one optimizer by itself; find each part's learning rate with a short sweep (make sweep) instead."
        )
    if not 0 < min_lr < max_lr:
        raise ConfigError(f"--min_lr={min_lr} and --max_lr={max_lr}: they must satisfy 0 < min_lr < max_lr.")
    finder = Tuner(trainer).lr_find(
        task, datamodule=cli.datamodule, min_lr=min_lr, max_lr=max_lr, num_training=steps, update_attr=False
    )
    assert finder is not None
    suggestion = finder.suggestion()
    if suggestion is None:
        raise ConfigError(
            f"the range test recorded too few losses to suggest a learning rate ({len(finder.results['lr'])} steps): "
            "give it more (--steps) or a wider range (--min_lr, --max_lr)."
        )
    run = Path(trainer.log_dir or trainer.default_root_dir)
    figure = cast("Figure", finder.plot(suggest=True))  # matplotlib: the dev install's (notebooks, sweep)
    run.mkdir(parents=True, exist_ok=True)
    figure.savefig(run / "lr_find.png", dpi=120)
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_figure("lr_find", figure)
            logger.experiment.flush()
    for provenance in (cb for cb in trainer.callbacks if isinstance(cb, Provenance)):  # type: ignore[attr-defined]
        provenance.update(ended=now(), status=f"lr range test: suggested lr {suggestion:.3g}", steps=steps)
    current = task.optimizer.keywords.get("lr") if hasattr(task.optimizer, "keywords") else None
    print(
        f"Suggested learning rate: {suggestion:.3g} (the config's: {current}); plot: {run / 'lr_find.png'}\n"
        f"  train with it: make train ARGS='--model.optimizer.init_args.lr={suggestion:.3g}'\n"
        f"  or in the config, under model.init_args.optimizer.init_args:  lr: {suggestion:.3g}",
        flush=True,
    )
    return suggestion


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m project.engine.run.lr_find", description=__doc__.split("\n")[0])
    parser.add_argument("--min_lr", type=float, default=1e-6)
    parser.add_argument("--max_lr", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps of the range test")
    known, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    run_with_exit_codes(lambda: lr_find(rest, known.min_lr, known.max_lr, known.steps))


if __name__ == "__main__":
    main()

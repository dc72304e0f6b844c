"""The command line: ``python -m project {fit,validate,test,predict} --config configs/default.yaml [--key=value]``.

Every YAML key is a constructor argument of the Trainer, ``Classifier`` or ``DigitsDataModule``, type-checked by
jsonargparse. ``fit`` ends by testing the best checkpoint.
"""

import shutil
import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback

from project.data import DigitsDataModule
from project.errors import ConfigError
from project.module import Classifier


class SaveConfig(SaveConfigCallback):
    """Lightning's config saver, which also removes the run directory it created when the run dies of a
    ``ConfigError`` (e.g. warmup longer than the run, found only once the run length is known) before any
    checkpoint: a bad value leaves no empty run behind in logs/."""

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, ConfigError) and self.already_saved and trainer.is_global_zero and trainer.log_dir:
            run_dir = Path(trainer.log_dir)
            if not any(run_dir.rglob("*.ckpt")):
                shutil.rmtree(run_dir, ignore_errors=True)


class CLI(LightningCLI):
    """``LightningCLI`` for ``Classifier`` + ``DigitsDataModule``; ``args=None`` reads ``sys.argv``."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        super().__init__(
            Classifier,
            DigitsDataModule,
            save_config_callback=SaveConfig,
            auto_configure_optimizers=False,
            args=args,
            run=run,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # Shapes come from the data, so nobody types them twice (and they cannot disagree).
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments("data.input_shape", "model.net.init_args.input_shape", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        if self.subcommand != "fit":
            return
        trainer = self.config.fit.trainer
        if trainer.max_epochs is None and trainer.max_steps in (None, -1):
            # Lightning would silently assume max_epochs=1000 and stretch the cosine schedule over it.
            raise ConfigError(
                "Neither trainer.max_epochs nor trainer.max_steps is set: the run length must be known for the "
                "LR schedule; set one of them (e.g. --trainer.max_epochs=30)."
            )

    def after_fit(self) -> None:
        for stopper in self.trainer.early_stopping_callbacks:
            if stopper.stopping_reason_message and self.trainer.is_global_zero:
                print(f"Stopped early at epoch {stopper.stopped_epoch}: {stopper.stopping_reason_message}", flush=True)
        checkpoint = self.trainer.checkpoint_callback
        best = getattr(checkpoint, "best_model_path", "") or None
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best, weights_only=True)
        if self.trainer.is_global_zero:
            metrics = self.trainer.callback_metrics
            scores = "  ".join(f"{k}={float(metrics[k]):.4f}" for k in ("test/acc", "test/loss") if k in metrics)
            print(f"Test of {best or 'the final weights (no checkpoint was saved)'}: {scores}", flush=True)


def main(args: list[str] | None = None) -> None:
    try:
        CLI(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)

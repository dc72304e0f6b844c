"""The command line: ``python -m project {fit,validate,test,predict} --config configs/default.yaml [--key=value]``.

Every YAML key is a constructor argument of the Trainer, the task (``model.class_path``: a ``Task``) or the DataModule
(``data.class_path``), type-checked by jsonargparse. On top of LightningCLI: the data's shapes and target names are
linked into the task and its net; a checkpoint is read with ``weights_only=True`` and must agree with the config; a
resumed run continues in its own directory (``run_directory.py``); ``fit`` ends by testing the best checkpoint. The
checks before a run are ``checks.py``; the one-sentence errors ``parser.py``'s and ``faults.py``'s.
"""

import sys
import time
import warnings
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, Checkpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_info

from project.engine.checkpointing.checkpoint_io import load_checkpoint
from project.engine.checkpointing.portable import learned_in, restoring
from project.engine.data.datamodule import DataModule
from project.engine.errors import ConfigError, config_error_in, raised_in_your_code
from project.engine.model.task import Task
from project.engine.observe.config_keys import flatten
from project.engine.observe.dashboard import log_hparams_with, simple, write_layout
from project.engine.observe.provenance import Provenance
from project.engine.observe.tracking import TrackerRun, fill_in, require_extra
from project.engine.run import faults, quiet
from project.engine.run.callback_keys import edit_callbacks
from project.engine.run.checks import (
    check_agrees_with_checkpoint,
    check_fit,
    check_task_fits_data,
    kind_of,
    manual_optimization,
    say_what_the_config_leaves_out,
)
from project.engine.run.faults import run_with_exit_codes
from project.engine.run.parser import Parser, carried_over, refused_by_constructor, torch_optimizer_names
from project.engine.run.run_directory import SaveConfig, continue_in_place

_SPECIAL_CKPT_PATHS = {"last", "best", "hpc", "registry"}  # checkpoint paths Lightning resolves itself
_LINKED_FROM_DATA = ("target_names",)  # the task's arguments linked from the data's (add_arguments_to_parser)
quiet.hide_upstream_lines()


class CLI(LightningCLI):
    """``LightningCLI`` for the config's task and DataModule; ``args=None`` reads ``sys.argv``."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        self._started = time.perf_counter()  # the command's start (fit's: its own, in before_fit)
        self._cli_args = torch_optimizer_names(list(args) if args is not None else sys.argv[1:])
        if args is None:  # from the command line: LightningCLI reads sys.argv itself, and warns when given both
            sys.argv[1:] = self._cli_args
        super().__init__(
            Task,
            DataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_callback=SaveConfig,
            auto_configure_optimizers=False,
            parser_class=Parser,
            args=None if args is None else self._cli_args,
            run=run,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--float32_matmul_precision",
            type=Literal["highest", "high", "medium"],
            default="highest",
            help="torch.set_float32_matmul_precision: 'high' lets float32 matmuls use TF32 on Ampere+ GPUs",
        )
        # Shapes and target names come from the data, so nobody types them twice (and they cannot disagree).
        for name in _LINKED_FROM_DATA:
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")
        net = "model.init_args.net.init_args"
        parser.link_arguments("data.num_outputs", f"{net}.num_outputs", apply_on="instantiate")
        parser.link_arguments("data.input_shape", f"{net}.input_shape", apply_on="instantiate")
        # The DataModule shards the data itself (seeded, resumable, unpadded for evaluation): Lightning must not
        # replace its samplers. Refused below if a config turns this back on.
        parser.set_defaults({"trainer.use_distributed_sampler": False})
        parser.add_argument(
            "--callback",
            type=dict[str, Any] | None,
            default=None,
            help="one listed callback off (--callback.TaskEarlyStopping=false) or one of its arguments set "
            "(--callback.LastCheckpoint.every_n_train_steps=50) without restating trainer.callbacks",
        )
        parser.add_argument(
            "--trackers",
            type=list[Logger] | None,
            default=None,
            help="experiment trackers logged to beside trainer.logger, which owns the run directory "
            "(configs/loggers/mlflow.yaml, wandb.yaml; project/engine/observe/tracking.py)",
        )

    def _dump_config(self) -> None:
        """Lightning's instantiator writes each instantiation link's value (the data's input_shape and num_outputs)
        into the task's dumped hyperparameters, and asserts that the key above it is there: a net whose only
        arguments are the linked ones dumps without ``init_args``, and its run ended in that AssertionError, raw.
        Private: no public hook between the dump and the instantiator (``lightning.pytorch.cli._InstantiatorFn``)."""
        super()._dump_config()
        net = (self.config_dump.get("model") or {}).get("init_args", {}).get("net")
        if isinstance(net, dict) and "class_path" in net:
            net.setdefault("init_args", {})

    def _parse_ckpt_path(self) -> None:
        """Lightning's version silently replaces the config's model hyperparameters with the
        checkpoint's; here a checkpoint is first read safely, and any disagreement is an error naming the key."""
        # Private: Lightning has no public hook here (Lightning #20801; #21408 proposes one). The tests of a
        # config disagreeing with its checkpoint fail if Lightning renames it.
        subcommand = self.config.get("subcommand")
        ckpt_path = subcommand and self.config[subcommand].get("ckpt_path")
        if not ckpt_path or str(ckpt_path) in _SPECIAL_CKPT_PATHS:
            return super()._parse_ckpt_path()
        checkpoint = load_checkpoint(ckpt_path)
        if subcommand == "predict" and self.config.predict.data.init_args.get("predict_path"):
            # New inputs need only what the data taught, which the checkpoint keeps: the training data is not read.
            self._learned = learned_in(checkpoint)
        before = flatten(self.config[subcommand].model.as_dict(), "model")
        # Lightning's own reads the file a second time and parses every hyperparameter into the config, the target
        # names included: they are linked from the data at instantiation anyway, and a language model's thousands of
        # them were deep-copied by every later validation of the config (seconds per `make predict`).
        hparams = {k: v for k, v in (checkpoint.get("hyper_parameters") or {}).items() if k not in _LINKED_FROM_DATA}
        hparams.pop("_instantiator", None)
        if hparams:
            if "_class_path" in hparams:  # as Lightning stores a subclass's arguments
                hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
            try:
                self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
            except SystemExit:  # as Lightning's own says it
                sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
                raise
        check_agrees_with_checkpoint(self.config[subcommand].model, before, ckpt_path, subcommand)
        if subcommand == "fit" and continue_in_place(self.config.fit, Path(ckpt_path), checkpoint):
            self.save_config_kwargs["overwrite"] = True

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        torch.set_float32_matmul_precision(config.float32_matmul_precision)
        if self.subcommand != "fit":
            config.trackers = None  # validate/test/predict of a run log nothing to its tracker run
        for key, logger in [
            ("trainer.logger", config.trainer.logger),
            *(("trackers", t) for t in config.trackers or []),
        ]:
            if getattr(logger, "class_path", None):  # a logger whose extra is not installed: refused in one sentence
                require_extra(key, logger.class_path)
        if config.callback:  # applied to the list, which the run's config.yaml then holds as it ran
            edit_callbacks(config.trainer, config.callback)
            config.callback = None
        if self.subcommand in ("validate", "test", "predict"):
            # validate, test and predict of a checkpoint write no run directory (their scores are printed) and no
            # checkpoint: without the run's checkpoint callbacks Lightning does not restore their state from the
            # checkpoint evaluated (and warn that their directory "has changed").
            config.trainer.logger = False
            config.trainer.callbacks = [
                cb for cb in config.trainer.callbacks or [] if not issubclass(kind_of(cb), Checkpoint)
            ]
        if self.subcommand == "predict":  # predictions are written in input order by one process
            trainer = self.config.predict.trainer
            trainer.devices, trainer.num_nodes, trainer.strategy = 1, 1, "auto"
        if self.subcommand != "fit":
            return
        trainer = self.config.fit.trainer
        check_fit(trainer)
        if kept := carried_over(self._cli_args, self.config.fit.model.get("init_args", {}).get("optimizer")):
            rank_zero_info(kept)
        if self.config.fit.trackers:
            if not getattr(trainer.logger, "class_path", None):
                raise ConfigError(
                    "trackers need trainer.logger, the logger that owns the run directory (TensorBoardLogger by "
                    "default): it is not set or false."
                )
            for tracker in self.config.fit.trackers:
                fill_in(tracker, trainer.logger)

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        if not self.model.automatic_optimization:  # the task steps its optimizers itself (manual_step)
            kwargs.update(manual_optimization(self.model, self._get(self.config_init, "trainer", default={})))
        trackers = self.config_init[self.subcommand].get("trackers") if self.subcommand else None
        if trackers:  # after the run directory's logger: Lightning takes the run directory from the first
            logger = self.config_init[self.subcommand]["trainer"]["logger"]
            kwargs["logger"] = [*(logger if isinstance(logger, list) else [logger]), *trackers]
        return super().instantiate_trainer(**kwargs)

    def instantiate_classes(self) -> None:
        try:
            with restoring(getattr(self, "_learned", None)):
                super().instantiate_classes()
        except ValueError as err:  # jsonargparse wraps what a constructor raised: our error unwrapped, else one line
            where = raised_in_your_code(err)  # a constructor of the user's raised: their line
            yours = ConfigError(where) if where else None
            raise (config_error_in(err) or yours or refused_by_constructor(err) or err) from None

    def after_instantiate_classes(self) -> None:
        task, data = self.model, self.datamodule
        check_task_fits_data(task, data)
        # The net may declare the input statistics it expects (a pretrained backbone: its pretraining's); the
        # DataModule, which alone knows the data, applies them unless its config says otherwise.
        expected = getattr(task.net, "input_statistics", None)
        if self.subcommand == "fit" and expected and data.hparams.get("normalize") is True:
            data.expected_normalization = expected
            print(
                f"Inputs normalised with the statistics {type(task.net).__name__} expects (mean {expected['mean']}, "
                f"std {expected['std']}); data.normalize=train uses the training split's instead."
            )
        callbacks = self.trainer.callbacks  # type: ignore[attr-defined]
        if self.subcommand == "predict" and not any(isinstance(cb, BasePredictionWriter) for cb in callbacks):
            rank_zero_info(
                "The config's trainer.callbacks lists no prediction writer (project.engine.inference.predictions."
                "CSVPredictionWriter, configs/default.yaml): the predictions are not written."
            )
        trackers = (self.config_init[self.subcommand].get("trackers") if self.subcommand == "fit" else None) or []
        if self.subcommand == "fit":
            say_what_the_config_leaves_out(self.trainer, callbacks, bool(trackers))
        for provenance in (cb for cb in callbacks if isinstance(cb, Provenance)):
            provenance.cli_args = self._cli_args  # what this CLI parsed (inside a notebook or a test: not sys.argv)
        for tracker_run in (cb for cb in callbacks if isinstance(cb, TrackerRun) and trackers):
            resolved = {k: v for k, v in self.config.fit.as_dict().items() if k != "config"}  # not the files' paths
            tracker_run.trackers, tracker_run.config = trackers, simple(flatten(resolved))

    def predict(self, **kwargs: Any) -> Any:
        """``Trainer.predict`` (LightningCLI calls a method of the subcommand's name), without Lightning's warning that
        the checkpoint's callbacks are missing: predict leaves the run's checkpoint callbacks out on purpose."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Be aware that when using `ckpt_path`, callbacks used to create")
            return self.trainer.predict(**kwargs)

    def before_fit(self) -> None:
        self._started = time.perf_counter()
        faults.run_dir = Path(self.trainer.log_dir) if self.trainer.log_dir else None
        if self.trainer.is_global_zero:
            write_layout(self.trainer.logger, self.model)
        if self.trainer.is_global_zero and self.trainer.log_dir:
            # What the DataModule says a run needs beside its checkpoint to read new inputs (a tokenizer.json).
            for name, text in self.datamodule.run_files().items():
                path = Path(self.trainer.log_dir) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            print(f"Run directory: {self.trainer.log_dir}  (resolved config: {self.trainer.log_dir}/config.yaml)")

    def after_fit(self) -> None:
        trainer = self.trainer
        for stopper in trainer.early_stopping_callbacks:
            if stopper.stopping_reason_message and trainer.is_global_zero:
                print(f"Stopped early at epoch {stopper.stopped_epoch}: {stopper.stopping_reason_message}", flush=True)
        checkpoint = trainer.checkpoint_callback
        best = getattr(checkpoint, "best_model_path", "") or None
        best_score = getattr(checkpoint, "best_model_score", None)
        trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best, weights_only=True)
        if not trainer.is_global_zero:
            return
        metrics = trainer.callback_metrics
        scores: dict[str, float] = {k: float(v) for k, v in sorted(metrics.items()) if k.startswith("test/")}
        if best_score is not None:
            scores[f"best {checkpoint.monitor}"] = float(best_score)  # type: ignore[union-attr]
        log_hparams_with(self.trainer, self.config.fit, scores)
        for provenance in (cb for cb in trainer.callbacks if isinstance(cb, Provenance)):  # type: ignore[attr-defined]
            provenance.update(scores=scores, best_checkpoint=best, judged_by=self._judged_by())
        for tracker_run in (cb for cb in trainer.callbacks if isinstance(cb, TrackerRun)):  # type: ignore[attr-defined]
            tracker_run.upload()
        self._say_scores("Test", best or "the final weights (no checkpoint was saved)", scores)

    def after_validate(self) -> None:
        self._say_scores("Validation", self.config.validate.get("ckpt_path") or "the initial weights")

    def after_test(self) -> None:
        self._say_scores("Test", self.config.test.get("ckpt_path") or "the initial weights")

    def _say_scores(self, what: str, of: str, scores: dict[str, float] | None = None) -> None:
        """The line that ends a command: what it evaluated, every score (of the stage, ``scores`` if given)."""
        if not self.trainer.is_global_zero:
            return
        prefix = "val/" if what == "Validation" else "test/"
        metrics = self.trainer.callback_metrics
        if scores is None:
            scores = {k: float(v) for k, v in sorted(metrics.items()) if k.startswith(prefix)}
        shown = "  ".join(f"{k}={v:.4f}" for k, v in scores.items())
        print(f"{what} of {of}: {shown}  ({time.perf_counter() - self._started:.1f} s)", flush=True)

    def _judged_by(self) -> dict[str, str]:
        """The metric the run is judged by (its best checkpoint's, else the task's) and its direction."""
        checkpoint = self.trainer.checkpoint_callback
        monitor = getattr(checkpoint, "monitor", None)
        if monitor:
            return {"metric": monitor, "mode": getattr(checkpoint, "mode", "min")}
        return {"metric": self.model.monitor, "mode": self.model.mode}


def main(args: list[str] | None = None) -> None:
    run_with_exit_codes(lambda: CLI(args))

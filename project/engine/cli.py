"""The command line: ``python -m project {fit,validate,test,predict} --config configs/default.yaml [--key=value]``.

Every YAML key is a constructor argument of the Trainer, of the task that ``model.class_path`` names (any
``project.engine.task.Task``: ``project.tasks.Classifier``, ``Regressor``, yours) or of the DataModule that
``data.class_path`` names (any ``project.engine.datamodule.DataModule``), type-checked by jsonargparse. On top
of LightningCLI, for every run: checkpoints are written atomically, Ctrl-C/SIGTERM save a resumable checkpoint,
``fit --ckpt_path <run>/checkpoints/last.ckpt`` continues that run in its own directory, a checkpoint is read
with ``weights_only=True`` and must agree with the config, and ``fit`` ends by testing the best checkpoint.
"""

import contextlib
import importlib
import os
import re
import shutil
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Literal, NoReturn

import lightning as L
import torch
from lightning.pytorch.callbacks import (
    BasePredictionWriter,
    Checkpoint,
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    ProgressBar,
)
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from project.engine.checkpoints import (
    DISK_FULL,
    AtomicCheckpointIO,
    CheckpointWriteError,
    free_space,
    load_checkpoint,
)
from project.engine.dashboard import write_layout
from project.engine.datamodule import DataModule, learned_in, restoring
from project.engine.errors import ConfigError, cause_of, config_error_in
from project.engine.last_checkpoint import Interrupted, LastCheckpoint, LoaderWorkerDied
from project.engine.monitored import ValidateTheLastStep
from project.engine.provenance import Provenance
from project.engine.runs import flatten
from project.engine.task import Task
from project.engine.tracking import TrackerRun, continue_runs, fill_in, require_extra
from project.recipe import WarmupSchedule

# Trainer settings that change results, shown beside the model's and data's in TensorBoard's HPARAMS view.
_TRAINER_HPARAMS = (
    "max_epochs", "max_steps", "precision", "accumulate_grad_batches", "gradient_clip_val", "devices", "num_nodes",
)  # fmt: skip
# Checkpoint paths Lightning resolves itself rather than reading a file.
_SPECIAL_CKPT_PATHS = {"last", "best", "hpc", "registry"}

PACKAGE = str(__package__).partition(".")[0]  # the top package (a renamed copy names its own)


class SaveConfig(SaveConfigCallback):
    """Lightning's config saver, for ``fit`` only (validate/test/predict of a run must not start a new run
    directory with a config.yaml in it). It also removes the run directory it created when the run dies of a
    ``ConfigError`` (e.g. warmup longer than the run, found only once the run length is known) before any
    checkpoint: a bad value leaves no empty run behind in logs/."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # fast_dev_run writes nothing (Lightning's meaning), not even a config.
        if stage == "fit" and not getattr(trainer, "fast_dev_run", False):
            super().setup(trainer, pl_module, stage)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        refused = isinstance(exception, ConfigError | MisconfigurationException)
        if not (refused and trainer.is_global_zero and trainer.log_dir):
            return
        run_dir = Path(trainer.log_dir)
        files = [p for p in run_dir.rglob("*") if p.is_file()]
        # Ours: it holds only what this run wrote at its start (the config, the logger's files, the provenance
        # record). A directory with a checkpoint, or anything else (a sweep trial's console.log, which holds the
        # error sentence), is never removed.
        ours = all(_written_at_start(p.name) for p in files)
        if ours and not any(p.suffix == ".ckpt" for p in files):
            # The loggers first (Lightning finalizes them again after this hook, harmlessly): TensorBoard's writer
            # thread could otherwise still be writing its event file into the removed directory, and its error
            # would replace the one-sentence refusal.
            for logger in trainer.loggers:
                logger.finalize("failed")
            shutil.rmtree(run_dir, ignore_errors=True)
            with contextlib.suppress(OSError):  # logs/<name> too, if this run was all it held
                run_dir.parent.rmdir()


def _written_at_start(name: str) -> bool:
    return name.startswith(("events.out.tfevents.", "pip-freeze-", "git-")) or name in (
        "provenance.json", "config.yaml", "hparams.yaml", "trackers.json", "tokenizer.json",
    )  # fmt: skip


class _Parser(LightningArgumentParser):
    """jsonargparse's parser, with its error for a bad key of a task or DataModule (classes chosen by class_path)
    shortened from the union's every alternative to the key and its own complaint, and printed alone: jsonargparse
    prints the whole usage (~50 lines) before it."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):  # raised for a caller to handle
            super().error(condensed(message), ex)
        print(f"error: {condensed(message)}  (--help lists every key)", file=sys.stderr)
        sys.exit(2)


def condensed(message: str) -> str:
    """'Parser key "model": Does not validate against any of the Union subtypes ... Parser key "lr": Expected a
    <class 'float'>. Got value: abc ...' -> 'model.lr: Expected a <class 'float'>. Got value: abc'."""
    if "Does not validate against any of the Union subtypes" not in message:
        return message
    keys, reason = [], ""
    for line in message.splitlines():
        text = line.strip()
        if key := re.fullmatch(r'(?:error: )?Parser key "([^"]+)":', text):
            keys.append(key.group(1))
        elif text.startswith("- Expected a <class 'NoneType'>"):
            break
        elif text and not text.startswith(("Does not validate", "Subtypes:", "Errors:", "- Problem with given")):
            reason = text
    given = re.search(r"Given value: NestedArg\(key='([^']+)'", message)  # the key as the command line spelled it
    name = f"{keys[0]}.{given.group(1)}" if given and keys else ".".join(keys)
    unknown = re.fullmatch(r"- Expected a dot import path string: (.+)", reason)
    if unknown and name.rpartition(".")[2] in _RECIPE_CLASSES:
        kind, known = _RECIPE_CLASSES[name.rpartition(".")[2]]
        return (
            f"{name}={unknown.group(1)}: no {kind} has that name; give one of {', '.join(known())} or the class "
            "path of your own (my_package.module.Class)."
        )
    # A bad argument of an injected class (model.optimizer.lr=abc): the class, not the whole Callable type and the
    # parsed Namespace jsonargparse names; a Literal: its choices in plain words.
    reason = re.sub(r"^Type .* expects a function or a callable class: (?:\w+: )?", "", reason)
    reason = re.sub(r"\. Got value: Namespace\(class_path='([^']+)'.*$", r" (\1)", reason)
    reason = re.sub(r"Expected a typing\.Literal\[(.*)\]\. Got value: (.*?)( \(|$)", r"\2 is not one of \1\3", reason)
    return f"{name}: {reason}" if name and reason else message


def _optimizers() -> list[str]:
    found, todo = set(), [torch.optim.Optimizer]
    while todo:  # AdamW is a subclass of Adam
        todo += (kind := todo.pop()).__subclasses__()
        found.add(kind)
    # Not those the recipe's parameter groups cannot use: LBFGS (no groups), SparseAdam (sparse gradients only), Muon
    # (matrices only).
    unfit = {"Optimizer", "LBFGS", "SparseAdam", "Muon"}
    return sorted(c.__name__ for c in found if c.__name__ not in unfit and getattr(torch.optim, c.__name__, 0) is c)


def _torch_optimizer_names(args: list[str]) -> list[str]:
    """A bare optimizer name on the command line (``--model.optimizer=SGD``) is torch.optim's: jsonargparse refuses a
    name that two imported libraries share (bitsandbytes, which peft imports where it is installed, has an SGD)."""
    key, named = "--model.optimizer", []
    for i, arg in enumerate(args):
        name = arg.removeprefix(key + "=") if arg.startswith(key + "=") else arg if i and args[i - 1] == key else ""
        if name.isidentifier() and isinstance(getattr(torch.optim, name, None), type):
            arg = arg.removesuffix(name) + f"torch.optim.{name}"
        named.append(arg)
    return named


def _schedules() -> list[str]:
    return [c.__name__ for c in WarmupSchedule.__subclasses__()]


# The task's recipe arguments that name a class: what each is, and the names it knows.
_RECIPE_CLASSES = {"optimizer": ("torch.optim optimizer", _optimizers), "schedule": ("schedule", _schedules)}


class CLI(LightningCLI):
    """``LightningCLI`` for the config's task and DataModule; ``args=None`` reads ``sys.argv``."""

    run_dir: Path | None = None  # the directory of the run being fitted, for main()'s message on a full disk

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        self._cli_args = _torch_optimizer_names(list(args) if args is not None else sys.argv[1:])
        if args is None:  # from the command line: LightningCLI reads sys.argv itself, and warns when given both
            sys.argv[1:] = self._cli_args
        super().__init__(
            Task,
            DataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_callback=SaveConfig,
            auto_configure_optimizers=False,
            parser_class=_Parser,
            args=None if args is None else self._cli_args,
            run=run,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--float32_matmul_precision", type=Literal["highest", "high", "medium"], default="highest",
            help="torch.set_float32_matmul_precision: 'high' lets float32 matmuls use TF32 on Ampere+ GPUs",
        )  # fmt: skip
        # Shapes and target names come from the data, so nobody types them twice (and they cannot disagree).
        parser.link_arguments("data.target_names", "model.init_args.target_names", apply_on="instantiate")
        net = "model.init_args.net.init_args"
        parser.link_arguments("data.num_outputs", f"{net}.num_outputs", apply_on="instantiate")
        parser.link_arguments("data.input_shape", f"{net}.input_shape", apply_on="instantiate")
        # The DataModule shards the data itself (seeded, resumable, unpadded for evaluation): Lightning must not
        # replace its samplers. Refused below if a config turns this back on.
        parser.set_defaults({"trainer.use_distributed_sampler": False})
        parser.add_argument(
            "--trackers", type=list[Logger] | None, default=None,
            help="experiment trackers logged to beside trainer.logger, which owns the run directory "
            "(configs/loggers/mlflow.yaml, wandb.yaml; project/engine/tracking.py)",
        )  # fmt: skip

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
        super()._parse_ckpt_path()
        after = flatten(self.config[subcommand].model.as_dict(), "model")
        # How to predict (a language model's sampling settings) is not what was trained: predict keeps the config's.
        settable = _settable_at_predict(self.config[subcommand].model) if subcommand == "predict" else ()
        for key in settable:
            if f"model.{key}" in before:
                self.config[subcommand].model.init_args[key] = before[f"model.{key}"]
        after = {k: v for k, v in after.items() if k.removeprefix("model.") not in settable}
        # A key the config leaves null (such as the shapes linked from the data) takes the checkpoint's value.
        conflicts = [k for k in sorted(before.keys() & after.keys()) if before[k] not in (None, after[k])]
        if conflicts:
            shown = ", ".join(f"{k}={after[k]!r} (config: {before[k]!r})" for k in conflicts[:4])
            raise ConfigError(
                f"ckpt_path={ckpt_path!r} was trained with {shown}: a checkpoint's model hyperparameters cannot "
                "change. To continue that run, use its own config (make resume RUN=<run dir>); to train with "
                "other values, start a new run."
            )
        if subcommand == "fit":
            self._continue_run_in_place(Path(ckpt_path), checkpoint)

    def _continue_run_in_place(self, ckpt_path: Path, checkpoint: dict[str, Any]) -> None:
        """Resuming ``<run>/checkpoints/*.ckpt`` logs into ``<run>`` itself, so TensorBoard shows one curve. Events
        the crashed process logged after this checkpoint are purged (TensorBoard's purge_step), so no step is
        shown twice; the run's config.yaml is rewritten with the resumed config; the trackers continue the runs
        recorded in its trackers.json."""
        run_dir = ckpt_path.resolve().parent.parent
        logger = self.config.fit.trainer.logger
        if not (run_dir / "config.yaml").is_file():
            return
        if not str(getattr(logger, "class_path", "")).endswith("TensorBoardLogger"):
            print(
                f"Resuming with trainer.logger={getattr(logger, 'class_path', logger)}: the run continues in a new "
                "run directory (continuing in place, with the steps after the checkpoint purged, needs "
                "TensorBoardLogger)."
            )
            return
        save_dir = str(run_dir.parent.parent)
        # ModelCheckpoint keeps its record of the best checkpoint only if its directory is spelled as before
        # (a relative "logs/..." stays relative); otherwise it would save best-v1.ckpt beside best.ckpt.
        for state in (checkpoint.get("callbacks") or {}).values():  # a ModelCheckpoint's (or subclass's) state
            dirpath = state.get("dirpath") if isinstance(state, dict) else None
            if dirpath and Path(dirpath).resolve() == run_dir / "checkpoints":
                save_dir = str(Path(dirpath).parent.parent.parent)
        logger.init_args.save_dir = save_dir
        logger.init_args.name = run_dir.parent.name
        logger.init_args.version = run_dir.name
        logger.init_args.purge_step = int(checkpoint.get("global_step", 0))
        continue_runs(self.config.fit.trackers or [], run_dir)  # in the same run directory: the same tracker runs
        self.save_config_kwargs["overwrite"] = True

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        torch.set_float32_matmul_precision(config.float32_matmul_precision)
        if self.subcommand != "fit":
            config.trackers = None  # validate/test/predict of a run log nothing to its tracker run
        for key, logger in _loggers_named(config):
            require_extra(key, logger.class_path)
        if self.subcommand == "predict":
            # Predictions are written in input order by one process, and log nothing.
            trainer = self.config.predict.trainer
            trainer.devices, trainer.num_nodes, trainer.strategy, trainer.logger = 1, 1, "auto", False
            # Nor does it write checkpoints: without the run's checkpoint callbacks Lightning does not restore their
            # state from the checkpoint predicted with (and warn that their directory "has changed").
            trainer.callbacks = [cb for cb in trainer.callbacks or [] if not issubclass(_kind(cb), Checkpoint)]
        if self.subcommand != "fit":
            return
        trainer = self.config.fit.trainer
        if trainer.use_distributed_sampler:
            raise ConfigError(
                "trainer.use_distributed_sampler=true: the DataModule builds its own seeded, resumable and unpadded "
                "samplers for every process, which Lightning's would replace (and pad); leave it false."
            )
        if trainer.max_epochs is None and trainer.max_steps in (None, -1) and not trainer.fast_dev_run:
            # Lightning would silently assume max_epochs=1000 and stretch the cosine schedule over it.
            raise ConfigError(
                "Neither trainer.max_epochs nor trainer.max_steps is set: the run length must be known for the "
                "LR schedule; set one of them (e.g. --trainer.max_epochs=30)."
            )
        _adapt_to_trainer_flags(trainer)
        if self.config.fit.trackers:
            if not getattr(trainer.logger, "class_path", None):
                raise ConfigError(
                    "trackers need trainer.logger, the logger that owns the run directory (TensorBoardLogger by "
                    "default): it is not set or false."
                )
            for tracker in self.config.fit.trackers:
                fill_in(tracker, trainer.logger)

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        trackers = self.config_init[self.subcommand].get("trackers") if self.subcommand else None
        if trackers:  # after the run directory's logger: Lightning takes the run directory from the first
            logger = self.config_init[self.subcommand]["trainer"]["logger"]
            kwargs["logger"] = [*(logger if isinstance(logger, list) else [logger]), *trackers]
        return super().instantiate_trainer(**kwargs)

    def instantiate_classes(self) -> None:
        try:
            with restoring(getattr(self, "_learned", None)):
                super().instantiate_classes()
        except ValueError as err:  # jsonargparse wraps what a subclass-mode DataModule raised: our error, unwrapped
            raise (config_error_in(err) or err) from None

    def after_instantiate_classes(self) -> None:
        task, data = self.model, self.datamodule
        if task.target_kind != data.target_kind:
            raise ConfigError(
                f"model.class_path={type(task).__name__} learns from {task.target_kind}, but data.class_path="
                f"{type(data).__name__} serves {data.target_kind} ({', '.join(data.target_names[:5])}): choose a "
                "task for these targets (configs/tasks/*.yaml), or set the DataModule's target type (e.g. "
                "data.target_type for a CSV)."
            )
        # A net that masks padding names the id it takes for it (a pretrained model's); the data must pad with it.
        rows, vocabulary = getattr(task.net, "vocab_size", None), getattr(data, "vocabulary", None)
        if rows is not None and vocabulary and len(vocabulary) > rows:
            raise ConfigError(
                f"model.net.class_path={type(task.net).__name__} embeds {rows} token ids, but the data's tokenizer has "
                f"{len(vocabulary)}: give the data the model's own tokenizer (e.g. data.tokenizer)."
            )
        net_pad, data_pad = getattr(task.net, "pad_id", None), getattr(data, "pad_id", None)
        if None not in (net_pad, data_pad) and net_pad != data_pad:
            raise ConfigError(
                f"model.net.class_path={type(task.net).__name__} takes id {net_pad} for padding, but the data pads "
                f"with {data_pad}: give the data the model's own tokenizer (e.g. data.tokenizer)."
            )
        own = getattr(task.net, "vocabulary", None)  # a pretrained model's tokenizer: the data's must be the same
        if own and vocabulary:
            differ = next((i for i, (a, b) in enumerate(zip(vocabulary, own, strict=False)) if a != b), None)
            if differ is not None:
                raise ConfigError(
                    f"the data's tokenizer is not model.net's: token id {differ} is {vocabulary[differ]!r} in the "
                    f"data's and {own[differ]!r} in the model's; give data.tokenizer the model's own (the same path "
                    "as model.net.init_args.name_or_path)."
                )
        # The net may declare the input statistics it expects (a pretrained backbone: its pretraining's); the
        # DataModule, which alone knows the data, applies them unless its config says otherwise.
        expected = getattr(task.net, "input_statistics", None)
        if self.subcommand == "fit" and expected and data.hparams.get("normalize") is True:
            data.expected_normalization = expected
            print(f"Inputs normalised with the statistics {type(task.net).__name__} expects (mean {expected['mean']}, "
                  f"std {expected['std']}); data.normalize=train uses the training split's instead.")  # fmt: skip
        callbacks = self.trainer.callbacks  # type: ignore[attr-defined]
        if self.subcommand == "predict" and not any(isinstance(cb, BasePredictionWriter) for cb in callbacks):
            rank_zero_info("The config's trainer.callbacks lists no prediction writer (project.engine.predict."
                           "CSVPredictionWriter, configs/default.yaml): the predictions are not written.")  # fmt: skip
        if self.subcommand == "fit":
            self._say_what_the_config_leaves_out(callbacks)
        for provenance in (cb for cb in callbacks if isinstance(cb, Provenance)):
            provenance.cli_args = self._cli_args  # what this CLI parsed (inside a notebook or a test: not sys.argv)
        trackers = self.config_init[self.subcommand].get("trackers") if self.subcommand == "fit" else None
        if trackers:
            resolved = self.config.fit.clone()
            resolved.pop("config", None)  # the config files' paths, not a setting of the run
            callbacks.append(TrackerRun(trackers, _simple(flatten(resolved.as_dict()))))

    def _say_what_the_config_leaves_out(self, callbacks: list[Any]) -> None:
        """What runs is what the config lists: a guarantee whose callback or plugin it leaves out is lost, and one line
        each says so (nothing is added behind the config's back)."""
        missing: list[tuple[str, type, str]] = []
        if self.trainer.checkpoint_callbacks:  # else no checkpoint is written: nothing to write atomically or resume
            io = self.trainer.strategy.checkpoint_io
            if not isinstance(getattr(io, "checkpoint_io", io), AtomicCheckpointIO):  # BackgroundCheckpointIO wraps it
                missing.append(("trainer.plugins", AtomicCheckpointIO,
                                "a crash during a checkpoint write can leave a half-written .ckpt"))  # fmt: skip
            if not any(isinstance(cb, LastCheckpoint) for cb in callbacks):
                missing.append(("trainer.callbacks", LastCheckpoint,
                                "no last.ckpt on Ctrl-C/SIGTERM, make resume has nothing to continue"))  # fmt: skip
        if not any(isinstance(cb, ValidateTheLastStep) for cb in callbacks):
            missing.append(("trainer.callbacks", ValidateTheLastStep,
                            "a run that stops at trainer.max_steps mid-epoch ends unvalidated"))  # fmt: skip
        if not any(isinstance(cb, Provenance) for cb in callbacks):
            missing.append(("trainer.callbacks", Provenance,
                            "no provenance.json: make runs and make sweep-status cannot list this run"))  # fmt: skip
        for key, kind, lost in missing:
            name = f"{kind.__module__}.{kind.__name__}"
            rank_zero_info(f"The config's {key} leaves out {name}: {lost} (configs/default.yaml lists it).")

    def predict(self, **kwargs: Any) -> Any:
        """``Trainer.predict`` (LightningCLI calls a method of the subcommand's name), without Lightning's warning that
        the checkpoint's callbacks are missing: predict leaves the run's checkpoint callbacks out on purpose."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Be aware that when using `ckpt_path`, callbacks used to create")
            return self.trainer.predict(**kwargs)

    def before_fit(self) -> None:
        self._started = time.perf_counter()
        CLI.run_dir = Path(self.trainer.log_dir) if self.trainer.log_dir else None
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
        self._log_hparams_with(scores)
        for provenance in (cb for cb in trainer.callbacks if isinstance(cb, Provenance)):  # type: ignore[attr-defined]
            provenance.update(scores=scores, best_checkpoint=best, judged_by=self._judged_by())
        for tracker_run in (cb for cb in trainer.callbacks if isinstance(cb, TrackerRun)):  # type: ignore[attr-defined]
            tracker_run.upload()
        shown = "  ".join(f"{k}={v:.4f}" for k, v in scores.items())
        took = time.perf_counter() - self._started
        print(f"Test of {best or 'the final weights (no checkpoint was saved)'}: {shown}  ({took:.1f} s)", flush=True)

    def _judged_by(self) -> dict[str, str]:
        """The metric the run is judged by (its best checkpoint's, else the task's) and its direction."""
        checkpoint = self.trainer.checkpoint_callback
        monitor = getattr(checkpoint, "monitor", None)
        if monitor:
            return {"metric": monitor, "mode": getattr(checkpoint, "mode", "min")}
        return {"metric": self.model.monitor, "mode": self.model.mode}

    def _log_hparams_with(self, scores: dict[str, float]) -> None:
        """The run's hyperparameters with its final scores, for TensorBoard's HPARAMS view (runs side by side)."""
        if self.trainer.logger is None:
            return
        config = self.config.fit
        params = {
            **flatten(config.model.as_dict(), "model"),
            **flatten(config.data.as_dict(), "data"),
            **{f"trainer.{k}": config.trainer[k] for k in _TRAINER_HPARAMS},
            "seed_everything": config.seed_everything,
        }
        params = _simple(params)
        metrics = {"hp/" + k.replace("best ", "").replace("/", "_"): v for k, v in scores.items()}
        for logger in self.trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.log_hyperparams(params, metrics)
            else:  # other loggers take no metrics with their hparams: the scores are logged as metrics
                logger.log_hyperparams(params)
                logger.log_metrics(metrics, step=self.trainer.global_step)
            logger.finalize("success")  # flush: nothing else closes the writer after the test


def _settable_at_predict(model: Any) -> tuple[str, ...]:
    """The task's constructor arguments that predict may change on a checkpoint (``Task.settable_at_predict``)."""
    module, _, name = str(getattr(model, "class_path", "")).rpartition(".")
    try:
        task = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return ()
    return tuple(getattr(task, "settable_at_predict", ()))


def _simple(params: dict[str, Any]) -> dict[str, Any]:
    """Values a logger's hyperparameters take (a list or None as its text)."""
    return {k: v if isinstance(v, int | float | str | bool) else str(v) for k, v in params.items()}


def _loggers_named(config: Any) -> list[tuple[str, Any]]:
    """(key, parsed config) of trainer.logger and each of the trackers that names a class."""
    logger = config.trainer.logger
    named = [("trainer.logger", logger)] if getattr(logger, "class_path", None) else []
    return named + [("trackers", t) for t in config.get("trackers") or []]


def _kind(callback: Any) -> type:
    """The class a parsed callback config names."""
    module, _, name = str(callback.class_path).rpartition(".")
    return getattr(importlib.import_module(module), name)


def _adapt_to_trainer_flags(trainer: Any) -> None:
    """Lightning's everyday flags keep their meaning with the default callbacks: callbacks that need what a flag
    turns off are dropped, each with one line saying so, instead of failing the run (``trainer`` is the parsed
    ``fit.trainer`` config, before anything is built)."""

    def monitors_val(callback: Any) -> bool:  # monitor null: the task's metric, a val/ one
        return str((callback.get("init_args") or {}).get("monitor") or "val/").startswith("val/")

    def drop(reason: str, unwanted: Any) -> None:
        kept = [cb for cb in trainer.callbacks or [] if not unwanted(cb)]
        dropped = [str(cb.class_path).rpartition(".")[2] for cb in trainer.callbacks or [] if unwanted(cb)]
        if dropped:
            print(f"{reason}: {', '.join(dropped)} turned off.")
        trainer.callbacks = kept

    if trainer.enable_checkpointing is False:
        drop(
            "trainer.enable_checkpointing=false: no checkpoint is written, the run cannot be resumed, and the final "
            "test uses the final weights",
            lambda cb: issubclass(_kind(cb), Checkpoint),
        )
    if trainer.limit_val_batches == 0:
        drop(
            "trainer.limit_val_batches=0 (no validation): nothing monitors val/ metrics, the final test uses the "
            "final weights",
            lambda cb: issubclass(_kind(cb), EarlyStopping | ModelCheckpoint) and monitors_val(cb),
        )
    if trainer.enable_progress_bar is False:
        drop("trainer.enable_progress_bar=false", lambda cb: issubclass(_kind(cb), ProgressBar))
    if trainer.logger in (False, None) and not trainer.fast_dev_run:
        drop("trainer.logger=false: no curves are written", lambda cb: issubclass(_kind(cb), LearningRateMonitor))
        if trainer.default_root_dir is None:  # Lightning would write config.yaml and checkpoints into the cwd
            base = Path("logs") / "no_logger"
            versions = [int(p.name[8:]) for p in base.glob("version_*") if p.name[8:].isdigit()]
            trainer.default_root_dir = str(base / f"version_{max(versions, default=-1) + 1}")


def _resume_command() -> str:
    """The command that continues the run being fitted (or, before one has a directory, the latest run)."""
    return f"make resume RUN={CLI.run_dir}" if CLI.run_dir else "make resume"


def _disk_fault(err: OSError) -> str | None:
    """One sentence for a failed write: the checkpoint's own (it names the file), else that of another writer on
    the same full disk (the logger's event file, found first or raised while the run shut down); None for any
    other OSError."""
    checkpoint = cause_of(err, CheckpointWriteError)
    if checkpoint is not None:
        return str(checkpoint.strerror)
    if err.errno not in DISK_FULL:
        return None
    run = CLI.run_dir
    where = f"{run} ({free_space(run)})" if run else "the run directory"
    return (f"no space left on the device writing to {where}; the checkpoints already written are untouched. Free "
            f"some space, then continue the run: {_resume_command()}")  # fmt: skip


# torch's two ways of saying a loader worker died: its SIGCHLD handler's, and the loader's when a fetch times out.
_DEAD_WORKER = re.compile(r"DataLoader worker \(pids?(?:\(s\))? ([\d, ]+)\) (?:is killed by signal: ([^.]+)|exited)")


def _worker_fault(err: RuntimeError) -> str | None:
    """One sentence for a DataLoader worker killed under the run (the out-of-memory killer, most often); None for
    any other RuntimeError."""
    match = _DEAD_WORKER.search(str(err))
    if match is None:
        return None
    pids, signal_name = match.groups()
    how = f"was killed by a signal ({signal_name})" if signal_name else "exited unexpectedly"
    kept = (f"The run stopped after step {err.step} with {err.checkpoint} saved" if isinstance(err, LoaderWorkerDied)
            else "The checkpoints already written are whole")  # fmt: skip
    return (f"a DataLoader worker (pid {pids.strip()}) {how}: most often the out-of-memory killer (dmesg names "
            "it); fewer data.num_workers, a smaller data.prefetch_factor or data.batch_size, or smaller samples "
            f"need less memory. {kept}; continue it: {_resume_command()}")  # fmt: skip


def _quiet_about_a_full_disk(args: threading.ExceptHookArgs) -> None:
    """A writer thread's full-disk error is raised again on the main thread, which reports it in one sentence."""
    if not (isinstance(args.exc_value, OSError) and args.exc_value.errno in DISK_FULL):
        threading.__excepthook__(args)


def main(args: list[str] | None = None) -> None:
    threading.excepthook = _quiet_about_a_full_disk
    try:
        CLI(args)
    except (ConfigError, MisconfigurationException) as err:
        message = str(err)
        if "Original Traceback" in message:  # raised in a DataLoader worker: torch prepends the worker's traceback
            message = message.rstrip().splitlines()[-1].partition(": ")[2]
        print(f"error: {' '.join(message.split())}", file=sys.stderr)  # Lightning's own misconfigurations too
        sys.exit(2)
    except OSError as err:  # a fault, not bad input: the run stops, what was written whole is kept
        fault = _disk_fault(err)
        if fault is None:
            raise
        print(f"error: {fault}", file=sys.stderr)
        sys.exit(1)
    except RuntimeError as err:  # a fault: a loader worker killed (LastCheckpoint stopped the run, or the loader)
        fault = _worker_fault(err)
        if fault is None and not isinstance(err, LoaderWorkerDied):
            raise
        if fault is not None:  # None: it was another process's worker, which says so
            print(f"error: {fault}", file=sys.stderr)
        sys.exit(1)
    except Interrupted as stop:
        if stop.rank == 0:
            run = stop.checkpoint.parent.parent
            print(
                f"Interrupted by {stop}. Resume with: make resume RUN={run}  (or: python -m {PACKAGE} fit "
                f"--config {run}/config.yaml --ckpt_path {stop.checkpoint})",
                file=sys.stderr,
            )
        sys.exit(128 + stop.signum)
    finally:
        # A DDP rank leaves its process group before the interpreter exits, however its run ended (finished, or
        # stopped by a signal at the step every rank stops at): left to interpreter shutdown, gloo's and the
        # rendezvous store's C++ threads are torn down after the peer that hosts the store may have gone, which
        # can abort the rank (exit 134: a failed job to SLURM and torchrun; seen after a SIGTERM too).
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

"""What the CLI checks before a run starts: the Trainer flags against the callbacks they make meaningless, the
guarantees a config leaves out (said, never added back), and the task against the data it is given."""

import contextlib
import pkgutil
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Checkpoint, EarlyStopping, LearningRateMonitor, ModelCheckpoint, ProgressBar
from lightning.pytorch.utilities import rank_zero_info

from project.engine.checkpointing.checkpoint_io import AtomicCheckpointIO
from project.engine.checkpointing.last_checkpoint import LastCheckpoint
from project.engine.errors import ConfigError
from project.engine.model.monitored import ValidateTheLastStep
from project.engine.observe.config_keys import flatten
from project.engine.observe.divergence import DivergenceGuard
from project.engine.observe.provenance import Provenance
from project.engine.observe.tracking import TrackerRun


def check_fit(trainer: Any) -> None:
    """The parsed ``fit.trainer`` config: refused when the DataModule's samplers or the schedule cannot work with it,
    then adapted to its flags."""
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
    adapt_to_trainer_flags(trainer)


def check_task_fits_data(task: Any, data: Any) -> None:
    """The task learns from the targets the data serves, and a net with its own tokenizer gets data tokenised by it."""
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


def manual_optimization(task: Any, trainer: dict[str, Any]) -> dict[str, Any]:
    """A task that steps its optimizers itself (manual optimization, ``Task.manual_step``): Lightning refuses the
    Trainer's clipping and accumulation for it, so the task clips as the config says; accumulation is refused in one
    sentence. Returns the Trainer arguments that change (the clipping, handed to the task)."""
    if (trainer.get("accumulate_grad_batches") or 1) != 1:
        raise ConfigError(
            f"trainer.accumulate_grad_batches={trainer['accumulate_grad_batches']!r}: {type(task).__name__} steps its "
            "optimizers itself (manual optimization), which Lightning cannot accumulate for; set it to 1 and raise "
            "data.batch_size instead."
        )
    strategy = trainer.get("strategy")
    if len(task.optimizers_of_parts or {}) > 1 and strategy in ("ddp", "ddp_spawn", "ddp_fork", "ddp_notebook"):
        raise ConfigError(
            f"trainer.strategy={strategy!r}: each of {type(task).__name__}'s optimizer steps leaves the other parts' "
            "parameters unused, which DDP refuses by default; set trainer.strategy=ddp_find_unused_parameters_true."
        )
    task.gradient_clipping = trainer.get("gradient_clip_val"), trainer.get("gradient_clip_algorithm")
    return {"gradient_clip_val": None, "gradient_clip_algorithm": None}


def say_what_the_config_leaves_out(trainer: L.Trainer, callbacks: list[Any], trackers: bool) -> None:
    """What runs is what the config lists: a guarantee whose callback or plugin it leaves out is lost, and one line
    each says so (nothing is added behind the config's back)."""
    missing: list[tuple[str, type, str]] = []
    if trainer.checkpoint_callbacks:  # else no checkpoint is written: nothing to write atomically or resume
        io = trainer.strategy.checkpoint_io
        if not isinstance(getattr(io, "checkpoint_io", io), AtomicCheckpointIO):  # BackgroundCheckpointIO wraps it
            why = "a crash during a checkpoint write can leave a half-written .ckpt"
            missing.append(("trainer.plugins", AtomicCheckpointIO, why))
        if not any(isinstance(cb, LastCheckpoint) for cb in callbacks):
            why = "no last.ckpt on Ctrl-C/SIGTERM, make resume has nothing to continue"
            missing.append(("trainer.callbacks", LastCheckpoint, why))
    if not any(isinstance(cb, DivergenceGuard) for cb in callbacks):
        why = "a run whose loss turns nan goes on to its end and may save non-finite checkpoints, best.ckpt too"
        missing.append(("trainer.callbacks", DivergenceGuard, why))
    if not any(isinstance(cb, ValidateTheLastStep) for cb in callbacks):
        why = "a run that stops at trainer.max_steps mid-epoch ends unvalidated"
        missing.append(("trainer.callbacks", ValidateTheLastStep, why))
    if not any(isinstance(cb, Provenance) for cb in callbacks):
        why = "no provenance.json: make runs and make sweep-status cannot list this run"
        missing.append(("trainer.callbacks", Provenance, why))
    if trackers and not any(isinstance(cb, TrackerRun) for cb in callbacks):
        why = "make resume starts new tracker runs, without config, provenance or artifacts"
        missing.append(("trainer.callbacks", TrackerRun, why))
    for key, kind, lost in missing:
        name = f"{kind.__module__}.{kind.__name__}"
        rank_zero_info(f"The config's {key} leaves out {name}: {lost} (configs/default.yaml lists it).")


def kind_of(callback: Any) -> type:
    """The class a parsed callback config names."""
    return pkgutil.resolve_name(str(callback.class_path))


def adapt_to_trainer_flags(trainer: Any) -> None:
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
            lambda cb: issubclass(kind_of(cb), Checkpoint),
        )
    if trainer.limit_val_batches == 0:
        drop(
            "trainer.limit_val_batches=0 (no validation): nothing monitors val/ metrics, the final test uses the "
            "final weights",
            lambda cb: issubclass(kind_of(cb), EarlyStopping | ModelCheckpoint) and monitors_val(cb),
        )
    if trainer.enable_progress_bar is False:
        drop("trainer.enable_progress_bar=false", lambda cb: issubclass(kind_of(cb), ProgressBar))
    if trainer.logger in (False, None) and not trainer.fast_dev_run:
        drop("trainer.logger=false: no curves are written", lambda cb: issubclass(kind_of(cb), LearningRateMonitor))
        if trainer.default_root_dir is None:  # Lightning would write config.yaml and checkpoints into the cwd
            base = Path("logs") / "no_logger"
            versions = [int(p.name[8:]) for p in base.glob("version_*") if p.name[8:].isdigit()]
            trainer.default_root_dir = str(base / f"version_{max(versions, default=-1) + 1}")


def check_agrees_with_checkpoint(model: Any, before: dict[str, Any], ckpt_path: Any, subcommand: str) -> None:
    """The config's model hyperparameters (``before``, flattened) agree with those ``ckpt_path`` holds, now in
    ``model``, or a ``ConfigError`` naming each that differs. A key the config leaves null (such as the shapes linked
    from the data) takes the checkpoint's value; how to predict (a language model's sampling settings,
    ``Task.settable_at_predict``) is not what was trained: predict keeps the config's."""
    after = flatten(model.as_dict(), "model")
    settable: tuple[str, ...] = ()
    if subcommand == "predict":
        with contextlib.suppress(ImportError, AttributeError, ValueError):
            task = pkgutil.resolve_name(str(getattr(model, "class_path", "")))
            settable = tuple(getattr(task, "settable_at_predict", ()))
    for key in settable:
        if f"model.{key}" in before:
            model.init_args[key] = before[f"model.{key}"]
    after = {k: v for k, v in after.items() if k.removeprefix("model.") not in settable}
    conflicts = [k for k in sorted(before.keys() & after.keys()) if before[k] not in (None, after[k])]
    if conflicts:
        shown = ", ".join(f"{k}={after[k]!r} (config: {before[k]!r})" for k in conflicts[:4])
        raise ConfigError(
            f"ckpt_path={ckpt_path!r} was trained with {shown}: a checkpoint's model hyperparameters cannot change. "
            "To continue that run, use its own config (make resume RUN=<run dir>); to train with other values, start "
            "a new run."
        )

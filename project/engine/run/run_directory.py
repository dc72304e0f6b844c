"""The run directory: ``config.yaml`` written when ``fit`` starts (and the directory removed again when the run is
refused before its first checkpoint), a resumed run continued in its own directory, and reading a run back: the
newest run (``latest_run``) and its curves (``read_scalars``)."""

import contextlib
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from project.engine.errors import ConfigError
from project.engine.hooks import defined_hooks_only
from project.engine.observe.tracking import continue_runs


@defined_hooks_only
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
        "provenance.json",
        "config.yaml",
        "hparams.yaml",
        "trackers.json",
        "tokenizer.json",
    )


def continue_in_place(config: Any, ckpt_path: Path, checkpoint: dict[str, Any]) -> bool:
    """Resuming ``<run>/checkpoints/*.ckpt`` logs into ``<run>`` itself, so TensorBoard shows one curve. Events
    the crashed process logged after this checkpoint are purged (TensorBoard's purge_step), so no step is
    shown twice; the run's config.yaml is rewritten with the resumed config; the trackers continue the runs
    recorded in its trackers.json. True when the run continues in place (its config.yaml is then
    overwritten)."""
    run_dir = ckpt_path.resolve().parent.parent
    logger = config.trainer.logger
    if not (run_dir / "config.yaml").is_file():
        return False
    if ckpt_path.name == "last.ckpt":
        _refuse_an_ended_run(config.trainer, run_dir)
    if not str(getattr(logger, "class_path", "")).endswith("TensorBoardLogger"):
        print(
            f"Resuming with trainer.logger={getattr(logger, 'class_path', logger)}: the run continues in a new "
            "run directory (continuing in place, with the steps after the checkpoint purged, needs "
            "TensorBoardLogger)."
        )
        return False
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
    continue_runs(config.trackers or [], run_dir)  # in the same run directory: the same tracker runs
    # Lightning warns that the checkpoint directory "exists and is not empty": continuing in it is the point.
    warnings.filterwarnings("ignore", "Checkpoint directory .* exists and is not empty")
    return True


def _refuse_an_ended_run(trainer: Any, run_dir: Path) -> None:
    """Resuming a run that trained as long as its config plans, or stopped early, would only test it again (and its
    early stopping would stop it again): refused, saying how to train on."""
    path = run_dir / "provenance.json"
    ended = json.loads(path.read_text())["segments"][-1] if path.is_file() else {}
    status, epochs, steps = ended.get("status", ""), ended.get("epochs", 0), ended.get("steps", 0)
    max_steps, max_epochs = trainer.max_steps or -1, trainer.max_epochs
    if status == "finished" and (0 < max_steps <= steps or (max_epochs is not None and max_epochs <= epochs)):
        raise ConfigError(
            f"{run_dir} finished its {epochs} epochs ({steps} steps): nothing is left to resume. To train it longer, "
            "give more (ARGS=--trainer.max_epochs=N, or max_steps; the schedule is re-planned)."
        )
    if status.startswith("stopped early"):
        raise ConfigError(
            f"{run_dir} {status}: resumed, its early stopping would stop it again. To train on from its weights, "
            f"start a new run: ARGS=--model.init_from={run_dir}."
        )


def latest_run(logs_dir: str | Path = "logs") -> Path | None:
    """The run directory (``<logs>/<name>/version_<N>``) whose ``checkpoints/last.ckpt`` is newest, as
    `make resume` picks it; None when there is none."""
    checkpoints = sorted(Path(logs_dir).glob("*/version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    return checkpoints[-1].parent.parent if checkpoints else None


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of a run, ``{tag: [(step, value), ...]}``, read with TensorBoard's own reader (which
    also applies the purge of steps re-run after a resume)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}

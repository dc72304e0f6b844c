"""Finding runs under logs/ and reading their curves back (for notebooks and tests)."""

import importlib
from pathlib import Path
from typing import Any


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


def load_run(checkpoint: str | Path) -> tuple[Any, Any]:
    """(model in eval mode on the CPU, DataModule with the run's settings and normalisation) from a checkpoint
    written by ``fit``, whatever DataModule it trained on. Read with ``weights_only=True``; a ``ConfigError`` in one
    sentence if the file is missing, truncated, unsafe, or not from this project's CLI."""
    from project.checkpoints import load_checkpoint
    from project.data import ClassificationDataModule
    from project.errors import ConfigError, config_error_in
    from project.module import Classifier

    hparams = load_checkpoint(checkpoint).get("datamodule_hyper_parameters") or {}
    class_path = hparams.get("_class_path")
    if not class_path:
        raise ConfigError(f"{str(checkpoint)!r} records no data.class_path: was it written by `python -m project fit`?")
    # The class the run's own config named (installed code, not code from the checkpoint). Loaded through the
    # concrete class: the base class's load_from_checkpoint would drop ``_class_path`` with the arguments it
    # does not know, and build the base.
    module, _, name = class_path.rpartition(".")
    data_class = getattr(importlib.import_module(module), name)
    if not issubclass(data_class, ClassificationDataModule):
        raise ConfigError(f"data.class_path={class_path!r} is not a project.data.ClassificationDataModule.")
    try:
        data = data_class.load_from_checkpoint(checkpoint, weights_only=True)
    except ValueError as err:  # e.g. the data moved since training: data.root='...': no such folder
        raise (config_error_in(err) or err) from None
    model = Classifier.load_from_checkpoint(checkpoint, weights_only=True, map_location="cpu").eval()
    return model, data

"""A trained run back from its checkpoint, as its task and DataModule (export, predict in a notebook, a
fine-tune's starting point)."""

import pkgutil
from pathlib import Path
from typing import Any

from project.engine.checkpointing import rng
from project.engine.checkpointing.checkpoint_io import load_checkpoint
from project.engine.checkpointing.portable import learned_in, restoring
from project.engine.data.datamodule import DataModule
from project.engine.errors import ConfigError, config_error_in
from project.engine.model.task import Task


def load_run(checkpoint: str | Path, read_data: bool = True) -> tuple[Any, Any]:
    """(task in eval mode on the CPU, DataModule with the run's settings and normalisation) from a checkpoint
    written by ``fit``, whatever task and DataModule it trained. With ``read_data=False`` the DataModule is rebuilt
    from what the checkpoint keeps (its learned attributes and examples) and reads none of the training data, which
    need not be on this machine. Read with ``weights_only=True``; a ``ConfigError`` in one sentence if the file is
    missing, truncated, unsafe, or not from this project's CLI."""
    saved = load_checkpoint(checkpoint)
    classes = []
    for key, base, config_key in (
        ("hyper_parameters", Task, "model"),
        ("datamodule_hyper_parameters", DataModule, "data"),
    ):
        class_path = (saved.get(key) or {}).get("_class_path")
        if not class_path:
            raise ConfigError(
                f"{str(checkpoint)!r} records no {config_key}.class_path: was it written by `python -m project fit` "
                "(of this version: runs trained before tasks were chosen by model.class_path load with that code)?"
            )
        # The class the run's own config named (installed code, not code from the checkpoint). Loaded through the
        # concrete class: the base class's load_from_checkpoint would drop ``_class_path`` with the arguments it
        # does not know, and build the base.
        found = pkgutil.resolve_name(class_path)
        if not issubclass(found, base):
            raise ConfigError(f"{config_key}.class_path={class_path!r} is not a {base.__module__}.{base.__name__}.")
        classes.append(found)
    task_class, data_class = classes
    try:
        with restoring(None if read_data else learned_in(saved)):
            data = data_class.load_from_checkpoint(checkpoint, weights_only=True)
    except ValueError as err:  # e.g. the data moved since training: data.root='...': no such folder
        raise (config_error_in(err) or err) from None
    # The net's initialisation draws from the global RNG before the weights replace it: a process that loads a run
    # (export, a notebook) keeps the random state it had.
    state = rng.capture_rng_state()
    try:
        model = task_class.load_from_checkpoint(checkpoint, weights_only=True, map_location="cpu").eval()
    finally:
        rng.restore_rng_state(state)
    return model, data

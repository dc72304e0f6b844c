"""The engine: everything that is neither your task, your data nor your net. You can leave it alone.

What your code and your configs name is imported from here, ``project.engine``, and only from here: this list is
the API that ``make update-engine`` keeps stable. The parts behind it, each importing only those below it
(``make lint`` checks the order, and that no part imports your code):

- ``sweep/``: hyperparameter search, each trial a normal ``fit``.
- ``run/``: the command line (``LightningCLI``), the start-up checks, faults and exit codes, the run directory.
- ``inference/``: a trained run back from its checkpoint, its predictions written, its export.
- ``observe/``: what a run shows and keeps: the monitor, progress, profiles, trackers, provenance, the runs table.
- ``model/``: the ``Task`` base, the optimizer and schedule, accumulation, metrics, fine-tuning, EMA.
- ``data/``: the ``DataModule`` base, loaders and resumable samplers, normalisation, the data contract.
- ``checkpointing/``: crash-safe checkpoint files, ``last.ckpt``, random state, portable runs, weights.
- ``errors.py`` and ``hooks.py``: what every part may import.

The names load on first use (``make runs`` imports this package without loading torch). A path of the flat
layout before these parts still imports, with a warning naming the new one (``moved.py``).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from project.engine import moved

# name: the module that defines it. One place: the public surface.
PUBLIC = {
    # what a task, a DataModule and their configs build on
    "Task": "project.engine.model.task",
    "IGNORE_INDEX": "project.engine.model.metrics",
    "DataModule": "project.engine.data.datamodule",
    "batches": "project.engine.data.batches",  # a module: what a batch holds, for nets and tasks
    "ConfigError": "project.engine.errors",
    "defined_hooks_only": "project.engine.hooks",
    # the recipe (project/recipe.py) and its schedule base
    "WarmupSchedule": "project.engine.model.optimization",
    "build_optimizer": "project.engine.model.optimization",
    "optimizer_groups": "project.engine.model.optimization",
    "planned_steps": "project.engine.model.optimization",
    "resolve_warmup_steps": "project.engine.model.optimization",
    # the callbacks and plugins a config lists
    "TaskCheckpoint": "project.engine.model.monitored",
    "TaskEarlyStopping": "project.engine.model.monitored",
    "ValidateTheLastStep": "project.engine.model.monitored",
    "EMA": "project.engine.model.ema",
    "LastCheckpoint": "project.engine.checkpointing.last_checkpoint",
    "AtomicCheckpointIO": "project.engine.checkpointing.checkpoint_io",
    "BackgroundCheckpointIO": "project.engine.checkpointing.checkpoint_io",
    "TrainingMonitor": "project.engine.observe.monitor",
    "ThrottledProgressBar": "project.engine.observe.progress",
    "ProfileSteps": "project.engine.observe.profiling",
    "Provenance": "project.engine.observe.provenance",
    "TrackerRun": "project.engine.observe.tracking",
    "DivergenceGuard": "project.engine.observe.divergence",
    "CSVPredictionWriter": "project.engine.inference.predictions",
    # a trained run, its weights, its directory
    "load_run": "project.engine.inference.load",
    "load_matching": "project.engine.checkpointing.weights",
    "read_weights": "project.engine.checkpointing.weights",
    "resolve_weights_file": "project.engine.checkpointing.weights",
    "latest_run": "project.engine.run.run_directory",
    "read_scalars": "project.engine.run.run_directory",
    # the command line
    "CLI": "project.engine.run.cli",
    "main": "project.engine.run.cli",
}
__all__ = sorted(PUBLIC)

moved.install()


def __getattr__(name: str) -> Any:
    if name not in PUBLIC:
        raise AttributeError(f"module 'project.engine' has no attribute {name!r} (its public names: {__all__})")
    module = import_module(PUBLIC[name])
    value = module if module.__name__.endswith("." + name) else getattr(module, name)
    globals()[name] = value  # once
    return value


if TYPE_CHECKING:  # what a type checker reads (`X as X`: exported); at run time, __getattr__ above
    from project.engine.checkpointing.checkpoint_io import AtomicCheckpointIO as AtomicCheckpointIO
    from project.engine.checkpointing.checkpoint_io import BackgroundCheckpointIO as BackgroundCheckpointIO
    from project.engine.checkpointing.last_checkpoint import LastCheckpoint as LastCheckpoint
    from project.engine.checkpointing.weights import load_matching as load_matching
    from project.engine.checkpointing.weights import read_weights as read_weights
    from project.engine.checkpointing.weights import resolve_weights_file as resolve_weights_file
    from project.engine.data import batches as batches
    from project.engine.data.datamodule import DataModule as DataModule
    from project.engine.errors import ConfigError as ConfigError
    from project.engine.hooks import defined_hooks_only as defined_hooks_only
    from project.engine.inference.load import load_run as load_run
    from project.engine.inference.predictions import CSVPredictionWriter as CSVPredictionWriter
    from project.engine.model.ema import EMA as EMA
    from project.engine.model.metrics import IGNORE_INDEX as IGNORE_INDEX
    from project.engine.model.monitored import TaskCheckpoint as TaskCheckpoint
    from project.engine.model.monitored import TaskEarlyStopping as TaskEarlyStopping
    from project.engine.model.monitored import ValidateTheLastStep as ValidateTheLastStep
    from project.engine.model.optimization import WarmupSchedule as WarmupSchedule
    from project.engine.model.optimization import build_optimizer as build_optimizer
    from project.engine.model.optimization import optimizer_groups as optimizer_groups
    from project.engine.model.optimization import planned_steps as planned_steps
    from project.engine.model.optimization import resolve_warmup_steps as resolve_warmup_steps
    from project.engine.model.task import Task as Task
    from project.engine.observe.divergence import DivergenceGuard as DivergenceGuard
    from project.engine.observe.monitor import TrainingMonitor as TrainingMonitor
    from project.engine.observe.profiling import ProfileSteps as ProfileSteps
    from project.engine.observe.progress import ThrottledProgressBar as ThrottledProgressBar
    from project.engine.observe.provenance import Provenance as Provenance
    from project.engine.observe.tracking import TrackerRun as TrackerRun
    from project.engine.run.cli import CLI as CLI
    from project.engine.run.cli import main as main
    from project.engine.run.run_directory import latest_run as latest_run
    from project.engine.run.run_directory import read_scalars as read_scalars

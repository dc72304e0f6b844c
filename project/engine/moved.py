"""The engine's module paths before it was cut into parts (``task.py``, ``checkpoints.py``, ... directly in
``project/engine/``), kept importable for one release so that a repository generated before the move, its saved
configs and its checkpoints still load. Each old path warns once, naming where its names live now;
``rewrite_old_paths.py`` rewrites them in your files."""

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

# old module: the modules its names live in now (the first holds most; a split file has two).
MOVED = {
    "accumulation": ("model.accumulation",),
    "batches": ("data.batches",),
    "callback_keys": ("run.callback_keys",),
    "checkpoints": ("checkpointing.checkpoint_io", "inference.load"),
    "checks": ("run.checks",),
    "cli": ("run.cli",),
    "config_keys": ("observe.config_keys",),
    "dashboard": ("observe.dashboard",),
    "data_contract": ("data.data_contract",),
    "datamodule": ("data.datamodule",),
    "divergence": ("observe.divergence",),
    "ema": ("model.ema",),
    "export": ("inference.export",),
    "faults": ("run.faults",),
    "finetuning": ("model.finetuning",),
    "git_snapshot": ("observe.git_snapshot",),
    "last_checkpoint": ("checkpointing.last_checkpoint",),
    "loaders": ("data.loaders",),
    "lr_find": ("run.lr_find",),
    "metrics": ("model.metrics",),
    "monitor": ("observe.monitor", "model.accumulation"),
    "monitored": ("model.monitored",),
    "normalization": ("data.normalization",),
    "optimization": ("model.optimization",),
    "parser": ("run.parser",),
    "parts": ("model.parts",),
    "portable": ("checkpointing.portable",),
    "predict": ("inference.predictions", "data.predict_inputs"),
    "profiling": ("observe.profiling",),
    "progress": ("observe.progress",),
    "provenance": ("observe.provenance",),
    "quiet": ("run.quiet",),
    "rng": ("checkpointing.rng",),
    "run_directory": ("run.run_directory",),
    "runs": ("observe.runs",),
    "samplers": ("data.samplers",),
    "sharding": ("model.sharding",),
    "task": ("model.task",),
    "task_contract": ("model.task_contract",),
    "tracking": ("observe.tracking",),
    "weights": ("checkpointing.weights",),
}
PACKAGE = __package__ or "project.engine"  # (a repository of your own renames the package)


def new_paths(old: str) -> list[str]:
    """The modules that hold an old module's names now (``old``: e.g. ``task``)."""
    return [f"{PACKAGE}.{new}" for new in MOVED[old]]


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        package, _, old = fullname.rpartition(".")
        if package != PACKAGE or old not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        old = spec.name.rpartition(".")[2]
        new = new_paths(old)
        warnings.warn(
            f"{spec.name} (named in your code or a config's class_path) moved to {' and '.join(new)}: import what "
            f"your code and configs name from {PACKAGE} (e.g. `from {PACKAGE} import Task`), the engine's API. The "
            f"old path goes in the next release; `python -m {PACKAGE}.rewrite_old_paths` rewrites your files (a run "
            "saved before keeps its paths and loads as it is).",
            FutureWarning,
            stacklevel=2,
        )
        modules = [importlib.import_module(n) for n in new]
        alias = types.ModuleType(spec.name, f"Moved to {', '.join(new)}.")

        def forward(name: str) -> Any:
            for module in modules:
                if hasattr(module, name):
                    return getattr(module, name)
            raise AttributeError(f"module {spec.name!r} (now {', '.join(new)}) has no attribute {name!r}")

        alias.__getattr__ = forward  # type: ignore[method-assign]
        return alias

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> None:
    """The old paths importable (once per process)."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())

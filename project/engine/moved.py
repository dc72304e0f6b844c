"""The engine's module paths before it was cut into parts (``project.engine.task``, ...), kept importable for one
release so that a repository generated before the move, its saved configs and its checkpoints still load. Each old
path warns once, naming where its names live now.

``python -m project.engine.moved`` rewrites the old paths in your files (code, configs, notebooks, pages) to the
engine's API (``from project.engine import Task``), or for a name outside it to its module's new path, and lists
what it changed; ``make update-engine`` runs it after merging. Run records (``logs/``) keep theirs: they load as
they are."""

import argparse
import importlib
import importlib.abc
import importlib.machinery
import re
import subprocess
import sys
import types
import warnings
from pathlib import Path
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
            f"{spec.name} moved to {' and '.join(new)}: import what your code and configs name from {PACKAGE} "
            f"(e.g. `from {PACKAGE} import Task`), the engine's API. The old path goes in the next release; "
            f"`python -m {PACKAGE}.moved` rewrites your files.",
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


STAYED = ("errors", "hooks")  # paths that did not move, whose names your code takes from the API all the same


def _home(old: str, name: str) -> str:
    """Where code names ``name`` of the old module ``old`` now: the API, else the new module that defines it."""
    public: dict[str, str] = importlib.import_module(PACKAGE).PUBLIC
    if name in public:
        return PACKAGE
    homes = [f"{PACKAGE}.{old}"] if old in STAYED else new_paths(old)
    for path in homes:
        if hasattr(importlib.import_module(path), name):
            return path
    return homes[0]


def rewrite(text: str) -> str:
    """``text`` with every old engine path in it replaced (imports, dotted names as configs write them)."""
    olds = "|".join(sorted([*MOVED, *STAYED], key=len, reverse=True))
    engine = re.escape(PACKAGE)

    def imports(match: re.Match[str]) -> str:
        indent, old, names = match.group(1), match.group(2), match.group(3).strip("()")
        by_home: dict[str, list[str]] = {}
        for item in (n.strip() for n in names.replace("\n", " ").split(",")):
            if item:
                by_home.setdefault(_home(old, item.split(" as ")[0].strip()), []).append(item)
        return "\n".join(f"{indent}from {home} import {', '.join(items)}" for home, items in by_home.items())

    text = re.sub(rf"(?m)^([ \t]*)from {engine}\.({olds}) import (\([^)]*\)|[^\n#]*[^\s#])", imports, text)
    text = re.sub(rf"\b{engine}\.({olds})\.([A-Za-z_]\w*)\b", lambda m: f"{_home(m[1], m[2])}.{m[2]}", text)
    moved = "|".join(sorted(MOVED, key=len, reverse=True))
    return re.sub(rf"\b{engine}\.({moved})\b(?![\w.])", lambda m: new_paths(m[1])[0], text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.moved", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="default: every file git knows here but the engine's")
    args = parser.parse_args(argv)
    engine_dir = PACKAGE.replace(".", "/") + "/"
    files = args.files
    if not files:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                                capture_output=True, text=True)  # fmt: skip
        if listed.returncode != 0:
            parser.exit(2, f"error: no git repository here to list your files ({listed.stderr.strip()}): name them.\n")
        kinds = {".py", ".yaml", ".yml", ".ipynb", ".md", ".toml", ".sh"}
        files = [
            Path(f) for f in listed.stdout.splitlines() if not f.startswith(engine_dir) and Path(f).suffix in kinds
        ]
    changed = []
    for path in files:
        if path.is_file() and (text := path.read_text()) != (new := rewrite(text)):
            path.write_text(new)
            changed.append(str(path))
    if changed:
        print(f"Rewrote the engine's old paths in {len(changed)} files: {', '.join(changed)}")


if __name__ == "__main__":
    main()

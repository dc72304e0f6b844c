"""The engine's API: what your code and configs name is importable from the package ``project.engine`` itself, and
the module paths of the flat layout before the engine's parts (``project/engine/task.py``'s, ...) still import,
with a warning naming the new path, so a repository, a saved config or a checkpoint from before the move loads."""

import ast
import importlib
import pickle
import sys
import warnings
from pathlib import Path

import pytest
from conftest import PACKAGE, fit

import project.engine as engine
from project.engine import moved, rewrite_old_paths


def test_every_public_name_is_the_object_its_module_defines() -> None:
    for name, module in engine.PUBLIC.items():
        defined = importlib.import_module(module)
        expected = defined if defined.__name__.endswith("." + name) else getattr(defined, name)
        assert getattr(engine, name) is expected, name


def test_a_type_checker_reads_the_same_names_as_run_time() -> None:
    tree = ast.parse(Path(engine.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    read = {(node.module, alias.name) for node in ast.walk(block) if isinstance(node, ast.ImportFrom)
            for alias in node.names if alias.asname == alias.name}  # fmt: skip
    listed = {
        (module.rpartition(".")[0], name) if module.endswith("." + name) else (module, name)
        for name, module in engine.PUBLIC.items()
    }
    assert read == listed


def _import_old(old: str) -> object:
    sys.modules.pop(f"{PACKAGE}.engine.{old}", None)  # imported afresh: it warns on import
    with pytest.warns(FutureWarning) as said:
        module = importlib.import_module(f"{PACKAGE}.engine.{old}")
    message = str(said[0].message)
    assert all(new in message for new in moved.new_paths(old)) and f"from {PACKAGE}.engine import" in message
    return module


@pytest.mark.guarantee(
    "The engine's API: a path of the flat layout before the engine's parts imports the same objects, warning with the "
    "new path; a config and a pickle naming one load; `python -m project.engine.rewrite_old_paths` rewrites your files"
)
def test_an_old_path_imports_the_same_objects_with_a_warning_naming_the_new_one() -> None:
    assert _import_old("task").Task is engine.Task  # type: ignore[attr-defined]
    old = _import_old("checkpoints")  # split in two: its names from both
    assert old.load_run is engine.load_run and old.AtomicCheckpointIO is engine.AtomicCheckpointIO  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        old.nothing  # type: ignore[attr-defined]  # noqa: B018
    for flat in moved.MOVED:  # every old module imports
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            sys.modules.pop(f"{PACKAGE}.engine.{flat}", None)
            importlib.import_module(f"{PACKAGE}.engine.{flat}")


def test_a_checkpoint_that_pickled_an_old_path_loads() -> None:
    sys.modules.pop(f"{PACKAGE}.engine.monitored", None)
    with pytest.warns(FutureWarning):
        loaded = pickle.loads(f"c{PACKAGE}.engine.monitored\nTaskCheckpoint\n.".encode())
    assert loaded is engine.TaskCheckpoint


@pytest.mark.slow
def test_a_config_that_names_an_old_class_path_runs(tmp_path: Path) -> None:
    sys.modules.pop(f"{PACKAGE}.engine.ema", None)
    with pytest.warns(FutureWarning, match=r"engine\.model\.ema"):
        cli = fit(tmp_path, "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
                  f"--trainer.callbacks+={PACKAGE}.engine.ema.EMA")  # fmt: skip
    assert any(isinstance(c, engine.EMA) for c in cli.trainer.callbacks)
    assert cli.trainer.global_step == 2


def test_the_rewrite_turns_old_paths_into_the_api_or_their_new_module(tmp_path: Path) -> None:
    engine_path = f"{PACKAGE}.engine"
    code, config = tmp_path / "mine.py", tmp_path / "mine.yaml"
    code.write_text(
        f"from {engine_path}.errors import ConfigError, config_error_in\n"  # did not move: the API all the same
        f"from {engine_path}.task import Task\n"
        f"from {engine_path}.checkpoints import load_run, check_fits\n"  # a split module: each name to its home
        f"import {engine_path}.samplers as samplers\n\n"
        f"def f():\n    from {engine_path}.optimization import (\n        WarmupSchedule,\n    )\n"
    )
    config.write_text(f"- class_path: {engine_path}.ema.EMA\n- class_path: {engine_path}.monitored.TaskCheckpoint\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        rewrite_old_paths.main([str(code), str(config), str(tmp_path / "absent.py")])
    assert code.read_text() == (  # one import of the API per block, as isort orders it
        f"from {engine_path} import ConfigError, Task, load_run\n"
        f"from {engine_path}.errors import config_error_in\n"
        f"from {engine_path}.checkpointing.checkpoint_io import check_fits\n"
        f"import {engine_path}.data.samplers as samplers\n\n"
        f"def f():\n    from {engine_path} import WarmupSchedule\n"
    )
    assert config.read_text() == f"- class_path: {engine_path}.EMA\n- class_path: {engine_path}.TaskCheckpoint\n"
